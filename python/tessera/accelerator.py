"""DeepSpeed's accelerator abstraction, for training scripts that call it instead of torch.cuda:

    from tessera.accelerator import get_accelerator      # was: from deepspeed.accelerator import ...
    device = torch.device(get_accelerator().device_name(local_rank))   # "cuda:0", or "cpu"
    get_accelerator().set_device(local_rank)
    backend = get_accelerator().communication_backend_name()           # "nccl", or "gloo"

The object answers for the machine the script runs on: CUDA when torch sees a GPU, else the CPU, so
a script written for GPUs runs on a CPU machine and the reverse. TESSERA_ACCELERATOR=cpu|cuda (or
DeepSpeed's DS_ACCELERATOR) picks one; set_accelerator() installs another object. The methods and
their names are DeepSpeed's (accelerator/abstract_accelerator.py); what differs on tessera:
the CPU's communication backend is Gloo (DeepSpeed's CPU accelerator answers "ccl"), bf16 and
fp16 count as supported on a CPU only where it has them in hardware (avx512_bf16 / amx_bf16,
avx512_fp16 / amx_fp16: elsewhere they run, ~10x slower than fp32), the CPU's memory figures
are the process's resident set (VmRSS, VmHWM) and the machine's (MemTotal, MemAvailable), and
there are no op builders (tessera's kernels are built with it).
"""
import contextlib
import functools
import os

import torch

_ENV = ("TESSERA_ACCELERATOR", "DS_ACCELERATOR")
_KINDS = ("cpu", "cuda")


def _proc_kib(path, key):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


class _Accelerator:
    """What both answer alike: RNG, dtypes, tensor constructors, the op-builder refusal."""

    _name = None
    _communication_backend_name = None
    _synchronized = True  # a device whose work is done when the call returns (the CPU), or not (CUDA)

    def is_synchronized_device(self):
        return self._synchronized

    def use_host_timers(self):
        return self._synchronized

    def resolves_data_dependency(self):
        return self._synchronized

    def handles_memory_backpressure(self):
        return self._synchronized

    # -- RNG (torch's generators: the CPU's also seeds CUDA's through manual_seed_all) --
    def random(self):
        return torch.random

    def manual_seed(self, seed):
        return torch.manual_seed(seed)

    def initial_seed(self):
        return torch.initial_seed()

    # -- dtypes --
    def supported_dtypes(self):
        return [torch.float32] + [d for d, ok in ((torch.bfloat16, self.is_bf16_supported()),
                                                  (torch.float16, self.is_fp16_supported())) if ok]

    def is_triton_supported(self):
        return False

    # -- tensors typed for this device (DeepSpeed's FloatTensor etc.: constructors) --
    def _tensor(self, dtype):
        return functools.partial(torch.tensor, dtype=dtype, device=self._name)

    BFloat16Tensor = property(lambda self: self._tensor(torch.bfloat16))
    ByteTensor = property(lambda self: self._tensor(torch.uint8))
    DoubleTensor = property(lambda self: self._tensor(torch.float64))
    FloatTensor = property(lambda self: self._tensor(torch.float32))
    HalfTensor = property(lambda self: self._tensor(torch.float16))
    IntTensor = property(lambda self: self._tensor(torch.int32))
    LongTensor = property(lambda self: self._tensor(torch.int64))

    def on_accelerator(self, tensor):
        return tensor.device.type == self._name

    def communication_backend_name(self):
        return self._communication_backend_name

    def get_compile_backend(self):
        return "inductor"

    def create_op_builder(self, class_name):
        raise NotImplementedError(
            "tessera.accelerator: %s: tessera has no op builders (DeepSpeed's create_op_builder JIT-compiles its "
            "C++/CUDA ops); tessera's kernels are built with the package, and the optimizers a config names run "
            "without one (docs/python.md)" % class_name)

    get_op_builder = create_op_builder
    build_extension = create_op_builder

    def __repr__(self):
        return "<tessera accelerator %s>" % self._name


class CpuAccelerator(_Accelerator):
    """A CPU rank: one process per rank, LOCAL_RANK its "device", Gloo between ranks."""

    _name = "cpu"
    _communication_backend_name = "gloo"

    _synchronized = True

    def device_name(self, device_index=None):
        return "cpu"

    def device(self, device_index=None):
        return torch.device("cpu")

    def set_device(self, device_index):
        pass  # a CPU rank has no device to select

    def current_device(self):
        return int(os.environ.get("LOCAL_RANK", 0))

    def current_device_name(self):
        return "cpu"

    def device_count(self):
        return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", 1)))

    def is_available(self):
        return True

    def synchronize(self, device_index=None):
        pass

    def manual_seed_all(self, seed):
        return torch.manual_seed(seed)

    def get_rng_state(self, device_index=None):
        return torch.get_rng_state()

    def set_rng_state(self, new_state, device_index=None):
        torch.set_rng_state(new_state)

    def default_generator(self, device_index=None):
        return torch.default_generator

    # -- streams and events: none on a CPU --
    @property
    def Stream(self):
        return None

    @property
    def Event(self):
        return None

    def stream(self, stream):
        return contextlib.nullcontext()

    def current_stream(self, device_index=None):
        return None

    def default_stream(self, device_index=None):
        return None

    # -- memory: the process's resident set and the machine's memory --
    def memory_allocated(self, device_index=None):
        return _proc_kib("/proc/self/status", "VmRSS")

    def max_memory_allocated(self, device_index=None):
        return _proc_kib("/proc/self/status", "VmHWM")

    def reset_max_memory_allocated(self, device_index=None):
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # the peak (VmHWM) restarts at the current resident set
        except OSError:
            pass

    reset_peak_memory_stats = reset_max_memory_allocated
    memory_reserved = memory_cached = memory_allocated
    max_memory_reserved = max_memory_cached = max_memory_allocated
    reset_max_memory_cached = reset_max_memory_allocated

    def memory_stats(self, device_index=None):
        return {"allocated_bytes.all.current": self.memory_allocated(),
                "allocated_bytes.all.peak": self.max_memory_allocated()}

    def total_memory(self, device_index=None):
        return _proc_kib("/proc/meminfo", "MemTotal")

    def available_memory(self, device_index=None):
        return _proc_kib("/proc/meminfo", "MemAvailable")

    def empty_cache(self):
        # tessera's large-block allocator keeps freed blocks for the next step: hand them back.
        from . import _C
        _C.cpu_block_cache_release()

    def pin_memory(self, tensor, align_bytes=1):
        return tensor  # nothing to pin for: the "device" is this memory

    def is_pinned(self, tensor):
        return False

    # -- dtypes from the CPU's features --
    def is_bf16_supported(self):
        return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16"})

    def is_fp16_supported(self):
        return bool(_cpu_flags() & {"avx512_fp16", "amx_fp16"})

    def amp(self):
        return torch.cpu.amp

    def range_push(self, msg):
        pass

    def range_pop(self):
        pass

    def lazy_call(self, callback):
        return callback()

    def export_envs(self):
        return []

    def visible_devices_envs(self):
        return []

    def set_visible_devices_envs(self, current_env, local_accelerator_ids):
        pass


class CudaAccelerator(_Accelerator):
    """A GPU rank: torch.cuda's answers, NCCL between ranks."""

    _name = "cuda"
    _communication_backend_name = "nccl"

    _synchronized = False

    def device_name(self, device_index=None):
        return "cuda" if device_index is None else "cuda:%d" % device_index

    def device(self, device_index=None):
        return torch.device("cuda", device_index) if device_index is not None else torch.device("cuda")

    def set_device(self, device_index):
        torch.cuda.set_device(device_index)

    def current_device(self):
        return torch.cuda.current_device()

    def current_device_name(self):
        return "cuda:%d" % torch.cuda.current_device()

    def device_count(self):
        return torch.cuda.device_count()

    def is_available(self):
        return torch.cuda.is_available()

    def synchronize(self, device_index=None):
        torch.cuda.synchronize(device_index)

    def manual_seed_all(self, seed):
        torch.cuda.manual_seed_all(seed)

    def get_rng_state(self, device_index=None):
        return torch.cuda.get_rng_state() if device_index is None else torch.cuda.get_rng_state(device_index)

    def set_rng_state(self, new_state, device_index=None):
        if device_index is None:
            torch.cuda.set_rng_state(new_state)
        else:
            torch.cuda.set_rng_state(new_state, device_index)

    def default_generator(self, device_index=None):
        return torch.cuda.default_generators[torch.cuda.current_device() if device_index is None else device_index]

    @property
    def Stream(self):
        return torch.cuda.Stream

    @property
    def Event(self):
        return torch.cuda.Event

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def current_stream(self, device_index=None):
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index=None):
        return torch.cuda.default_stream(device_index)

    def memory_allocated(self, device_index=None):
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index=None):
        return torch.cuda.max_memory_allocated(device_index)

    def reset_max_memory_allocated(self, device_index=None):
        torch.cuda.reset_peak_memory_stats(device_index)

    reset_peak_memory_stats = reset_max_memory_allocated
    reset_max_memory_cached = reset_max_memory_allocated

    def memory_reserved(self, device_index=None):
        return torch.cuda.memory_reserved(device_index)

    memory_cached = memory_reserved

    def max_memory_reserved(self, device_index=None):
        return torch.cuda.max_memory_reserved(device_index)

    max_memory_cached = max_memory_reserved

    def memory_stats(self, device_index=None):
        return torch.cuda.memory_stats(device_index)

    def total_memory(self, device_index=None):
        return torch.cuda.get_device_properties(torch.cuda.current_device() if device_index is None
                                                else device_index).total_memory

    def available_memory(self, device_index=None):
        return torch.cuda.mem_get_info(device_index)[0]

    def empty_cache(self):
        torch.cuda.empty_cache()

    def pin_memory(self, tensor, align_bytes=1):
        return tensor.pin_memory()

    def is_pinned(self, tensor):
        return tensor.is_pinned()

    def is_bf16_supported(self):
        return torch.cuda.is_bf16_supported()

    def is_fp16_supported(self):
        return True

    def is_triton_supported(self):
        return torch.cuda.get_device_capability()[0] >= 7

    def amp(self):
        return torch.cuda.amp

    def range_push(self, msg):
        torch.cuda.nvtx.range_push(msg)

    def range_pop(self):
        torch.cuda.nvtx.range_pop()

    def lazy_call(self, callback):
        return torch.cuda._lazy_call(callback)

    def export_envs(self):
        return ["NCCL"]

    def visible_devices_envs(self):
        return ["CUDA_VISIBLE_DEVICES"]

    def set_visible_devices_envs(self, current_env, local_accelerator_ids):
        current_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, local_accelerator_ids))


_installed = None


def _from_environment():
    for key in _ENV:
        value = os.environ.get(key)
        if value:
            if value not in _KINDS:
                raise ValueError("tessera.accelerator: %s=%r is not an accelerator tessera has (expected one of %s)"
                                 % (key, value, ", ".join(_KINDS)))
            if value == "cuda" and not torch.cuda.is_available():
                raise RuntimeError("tessera.accelerator: %s=cuda, but torch sees no CUDA device here (torch %s); "
                                   "unset it or use cpu" % (key, torch.__version__))
            return value
    return "cuda" if torch.cuda.is_available() else "cpu"


def get_accelerator():
    """The accelerator this process trains on (chosen once: TESSERA_ACCELERATOR / DS_ACCELERATOR, else
    CUDA when torch sees a GPU, else the CPU)."""
    global _installed
    if _installed is None:
        _installed = CudaAccelerator() if _from_environment() == "cuda" else CpuAccelerator()
    return _installed


def set_accelerator(accelerator):
    """Installs `accelerator` as the one get_accelerator() returns (DeepSpeed's set_accelerator)."""
    global _installed
    _installed = accelerator


def is_current_accelerator_supported():
    return get_accelerator()._name in _KINDS
