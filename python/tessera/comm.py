"""Process information and a few collectives, like deepspeed.comm.

Rank, world size and local rank come from the environment the job was launched with
(`tessera launch`, torchrun, SLURM, Open MPI; a single process when none is set) and need no
connection. barrier/all_reduce/broadcast use tessera's process groups (c10d Gloo, or NCCL with CUDA
tensors), created once per process: by init_distributed(), by tessera.initialize(), or lazily by the
first collective. The first of those also makes torch.distributed's default process group on the same
rendezvous (unless the script made it before), so the script's own torch.distributed calls work.
"""
import atexit
import os
import signal
import sys
import threading

import torch

from . import _C

__all__ = [
    "get_rank", "get_world_size", "get_local_rank", "get_local_world_size", "is_initialized",
    "init_distributed", "barrier", "all_reduce", "broadcast", "describe", "split_axis", "log_summary",
]

_lock = threading.Lock()
_context = None  # _C.ParallelContext, one per process
_info = None     # the environment's rendezvous info, read once

_GROUPS = ("world", "data", "context", "tensor", "pipe", "model")
_splits = []  # split_axis calls made before the axis groups existed, applied when they are made
_named = set()  # the factors split_axis named
_OPS = ("sum", "avg", "max", "min")


def _environment():
    global _info
    if _info is None:
        _info = _C.rendezvous_info()
    return _info


def get_rank():
    """This process's global rank (0 .. world size - 1)."""
    return _context.rank if _context is not None else _environment()["rank"]


def get_world_size():
    """The number of processes in the job."""
    return _context.world_size if _context is not None else _environment()["world_size"]


def get_local_rank():
    """This process's rank on its node (use it to pick a GPU)."""
    return _context.local_rank if _context is not None else _environment()["local_rank"]


def get_local_world_size():
    """The number of processes on this node."""
    return _context.local_world_size if _context is not None else _environment()["local_world_size"]


def is_initialized():
    """Whether this process has joined the job's process groups."""
    return _context is not None


def axes_made():
    """Whether the data/tensor/pipe groups exist (their degrees are fixed)."""
    return _context is not None and _context.axis_groups_made


def init_distributed(dist_backend=None, auto_mpi_discovery=True, distributed_port=None, verbose=True, timeout=None,
                     init_method=None, dist_init_required=None, config=None, rank=-1, world_size=-1, *,
                     backend=None, tensor_parallel=None, pipeline_stages=None, context_parallel=None):
    """Joins the job (every rank must call it); idempotent. DeepSpeed's deepspeed.init_distributed.

    It makes the rendezvous store and the world group, and torch.distributed's default process
    group on the same store (so torch.distributed.get_rank(), barrier(), all_reduce() and
    DistributedSampler() work in the script). The data, tensor and pipe groups are made by
    tessera.initialize() from the config (or here, when tensor_parallel/pipeline_stages/context_parallel
    are given: a tessera.pipe.PipelineModule built before tessera.initialize needs them then).

    dist_backend (or backend): None/"auto" (NCCL when a GPU is visible, else Gloo), "gloo" or
    "nccl". timeout: a datetime.timedelta (or seconds) for the rendezvous and every collective
    (default TESSERA_TIMEOUT_S, 300 s). rank/world_size: -1, or the environment's values.
    distributed_port, auto_mpi_discovery, verbose and dist_init_required are accepted for
    DeepSpeed's scripts: the rendezvous reads MASTER_PORT (tessera launch, torchrun, SLURM, Open MPI).
    """
    if dist_backend is not None and backend is not None and dist_backend != backend:
        raise ValueError("tessera.comm.init_distributed: dist_backend=%r and backend=%r differ" % (dist_backend, backend))
    chosen = backend if backend is not None else dist_backend
    if init_method not in (None, "env://"):
        raise ValueError("tessera.comm.init_distributed: init_method=%r is not supported: tessera meets at "
                         "MASTER_ADDR:MASTER_PORT from the environment (env://); tessera launch and torchrun set them"
                         % (init_method,))
    if config is not None:
        raise ValueError("tessera.comm.init_distributed: config= is not supported here (DeepSpeed reads its comms "
                         "logger from it); give the config to tessera.initialize()")
    info = _environment()
    for name, given, actual in (("rank", rank, info["rank"]), ("world_size", world_size, info["world_size"])):
        if given not in (-1, None) and int(given) != actual:
            raise ValueError("tessera.comm.init_distributed: %s=%d but the environment (%s) says %d"
                             % (name, int(given), info["source"], actual))
    seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
    return parallel_context(chosen or "auto", tensor_parallel, pipeline_stages,
                            make_axes=tensor_parallel is not None or pipeline_stages is not None or
                            context_parallel is not None, timeout_s=seconds, context=context_parallel)


def parallel_context(backend="auto", tensor=None, pipe=None, make_axes=True, timeout_s=None, device=None,
                     context=None):
    """The process's ParallelContext. The first call joins the job (world group, and torch.distributed's
    default group); the axis groups are made by the first call with make_axes, with tensor x pipe x
    context (default 1 x 1 x 1), and are fixed from then on. device: where the model lives (a torch.device or
    str), given by whoever knows it (initialize, zero.Init): the axis groups take their tensors there
    (Gloo with a CUDA device stages collectives through host memory, so ranks may share a GPU)."""
    global _context
    if not isinstance(backend, str):
        raise TypeError("tessera.comm: backend must be a str ('auto', 'gloo' or 'nccl'), got %s" % type(backend).__name__)
    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError("tessera.comm: unknown backend %r (expected 'auto', 'gloo' or 'nccl')" % backend)
    with _lock:
        if _context is None:
            import torch.distributed as dist
            torch_first = dist.is_available() and dist.is_initialized()
            _context = _while_sigint_kills(lambda: _C.ParallelContext(
                1, 1, backend, defer_axis_groups=True, store_may_exist=torch_first, timeout_s=float(timeout_s or 0)))
            if not torch_first:
                _init_torch_distributed(_context, timeout_s)
        elif backend not in ("auto", _context.backend):
            raise ValueError(
                "tessera.comm: the process groups already use %s, %s was asked for; call "
                "tessera.comm.init_distributed(backend=...) first" % (_context.backend, backend))
        wanted = "" if device is None else str(device)
        if make_axes and not _context.axis_groups_made:
            _while_sigint_kills(lambda: _context.make_axis_groups(int(tensor or 1), int(pipe or 1), wanted,
                                                                  int(context or 1)))
            for axis, factors in _splits:
                _context.split_axis(axis, factors)
        elif make_axes and wanted and _context.device != _same_device(wanted, _context):
            raise ValueError(
                "tessera.comm: the process groups take tensors on %s, the model is on %s; one process trains on one "
                "device (move the model there before tessera.initialize)" % (_context.device, wanted))
        elif make_axes and ((_context.tensor, _context.pipe) != (int(tensor or 1), int(pipe or 1)) or
                            (context is not None and _context.context_size != int(context))) and \
                (tensor, pipe, context) not in ((None, None, None), (1, 1, None), (1, 1, 1)):
            raise ValueError(
                "tessera.comm: the process groups were made for tensor %d x pipe %d x context %d, the config asks "
                "for tensor %d x pipe %d x context %d; the degrees are fixed by the first tessera.initialize() (or "
                "collective on a data/tensor/pipe group)" % (_context.tensor, _context.pipe, _context.context_size,
                                                             int(tensor or 1), int(pipe or 1),
                                                             int(context or _context.context_size)))
        return _context


def _same_device(device, context):
    """`device` as the context names devices ("cuda" -> "cuda:LOCAL_RANK" as the context resolves it)."""
    if device == "cuda":
        return "cuda:%d" % context.local_rank if context.backend == "gloo" else context.device
    return device


def _init_torch_distributed(context, timeout_s):
    """torch.distributed's default process group, over the rendezvous tessera just made (its own key
    prefix on the same store; rank 0 hosts it), so scripts' torch.distributed calls work. Gloo, with
    NCCL for CUDA tensors when tessera uses NCCL."""
    import datetime
    import torch.distributed as dist
    if not dist.is_available():
        return
    info = context.info
    timeout = datetime.timedelta(seconds=float(timeout_s or info["timeout_s"]))
    if info["world_size"] == 1:
        store = dist.HashStore()
    else:
        store = dist.TCPStore(info["master_addr"], info["master_port"], info["world_size"], is_master=False,
                              timeout=timeout, wait_for_workers=False)
    backend = "cpu:gloo,cuda:nccl" if context.backend == "nccl" else "gloo"
    excepthook = sys.excepthook
    dist.init_process_group(backend, store=dist.PrefixStore("torch.distributed/", store), rank=info["rank"],
                            world_size=info["world_size"], timeout=timeout)
    if os.environ.get("TESSERA_TAG_OUTPUT") == "1":  # tessera launch --tag-output prefixes each line already;
        sys.excepthook = excepthook                   # torch's hook would add a second "[rankN]: "
    atexit.register(_destroy_torch_default_group)


def _destroy_torch_default_group():
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


def _while_sigint_kills(fn):
    """Runs fn (the rendezvous: it may wait minutes for the other ranks, in C++, where Python cannot
    raise KeyboardInterrupt) with SIGINT's default action, so Ctrl-C ends the process at once rather
    than after the wait. Only from the main thread, and only when SIGINT has Python's default handler."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return fn()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        return fn()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _group(group):
    if group not in _GROUPS and not (isinstance(group, str) and set(group.split("*")) <= set(_GROUPS[1:]) | _named):
        raise ValueError("tessera.comm: unknown group %r (expected one of %s, a factor split_axis named, or a "
                         "product such as 'data*tensor')" % (group, ", ".join(_GROUPS)))
    return group


def split_axis(axis, factors):
    """Splits a grid axis into named factors, outer to inner, which collectives and parameter groups
    can then name as their group (a param group's "communicator"):

        tessera.comm.split_axis("data", [("expert_data", 2), ("expert", 2)])

    on 4 data-parallel ranks makes ranks {0, 1} and {2, 3} the "expert" groups and {0, 2}, {1, 3} the
    "expert_data" groups: parameters that differ across "expert" (each rank's own experts) are
    averaged over "expert_data". The factors' product must be the axis's size. Every rank calls it,
    in the same order; before tessera.initialize it is applied when the axis groups are made (the
    config fixes the tensor and pipe degrees, and so the data axis's size)."""
    if not isinstance(axis, str):
        raise TypeError("tessera.comm.split_axis: axis must be a str ('data', 'tensor' or 'pipe'), got %s"
                        % type(axis).__name__)
    factors = [(str(name), int(size)) for name, size in factors]
    with _lock:
        if _context is not None and _context.axis_groups_made:
            _context.split_axis(axis, factors)
        else:
            _splits.append((axis, factors))
        _named.update(name for name, _ in factors)


def barrier(group="world"):
    """Blocks until every rank of the group has called it."""
    parallel_context(make_axes=group != "world").barrier(_group(group))


def all_reduce(tensor, op="sum", group="world"):
    """Reduces `tensor` in place across the group (op: "sum", "avg", "max", "min"); returns it."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("tessera.comm.all_reduce: tensor must be a torch.Tensor, got %s" % type(tensor).__name__)
    if op not in _OPS:
        raise ValueError("tessera.comm.all_reduce: unknown op %r (expected one of %s)" % (op, ", ".join(_OPS)))
    parallel_context(make_axes=group != "world").all_reduce(tensor, op, _group(group))
    return tensor


def broadcast(tensor, src=0, group="world"):
    """Copies `tensor` from group rank `src` to every rank of the group, in place; returns it."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("tessera.comm.broadcast: tensor must be a torch.Tensor, got %s" % type(tensor).__name__)
    parallel_context(make_axes=group != "world").broadcast(tensor, int(src), _group(group))
    return tensor


def log_summary(show_straggler=False, return_dict=False, prof_ops=None, debug=False):
    """deepspeed.comm.log_summary: every rank calls it; rank 0 prints, per group, collective and
    message size, the count, latency and algorithm and bus bandwidth of this rank's collectives so far
    (tessera/comms_logger.py). prof_ops: only these collectives."""
    from .comms_logger import CommsLogger
    logger = CommsLogger(parallel_context(make_axes=False), {"prof_all": prof_ops is None, "prof_ops": prof_ops or [],
                                                             "debug": debug})
    return logger.log_summary(show_straggler=show_straggler, return_dict=return_dict)


def describe():
    """"rank 1 of 2 (pipe 0, data 1, tensor 0) in pipe 1 x data 2 x tensor 1, gloo" once joined."""
    if _context is None:
        i = _environment()
        return "rank %d of %d (%s; process groups not created yet)" % (i["rank"], i["world_size"], i["source"])
    return _context.describe()
