"""The engine on one GPU (cuda:0, NCCL with one rank) against a plain PyTorch loop on the same GPU:
ZeRO 0/1/2, AdamW (the fused GPU kernel) and SGD, fp32 and bf16 (gradients reduced in bf16 and in
fp32: communication_data_type), gradient clipping active, two
param groups, buckets small enough that every step has several. And the step's host
synchronizations, counted by CUDA's sync debug mode: at most one per step (the gradient norm,
which also decides overflow). Skipped, with the reason, where no GPU is visible; `ctest -L gpu`
runs this file.

Tolerances: fp32 (TF32 off) parameters 2e-5 and losses 2e-5 absolute (the fused AdamW kernel and
torch's foreach Adam round differently); bf16: the CPU parity test's (tests/python/engine/test_parity.py).
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from conftest import WORKERS, check, child_env, launch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU tests need one")]

FP32_TOL = 2e-5
BF16_PARAM_TOL, BF16_LOSS_RTOL = 1.5e-2, 3e-3


def run_worker(*args):
    proc = subprocess.run([sys.executable, os.path.join(WORKERS, "gpu_worker.py"), *map(str, args)],
                          env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("optimizer", ["AdamW", "SGD"])
def test_fp32_matches_plain_pytorch_on_the_gpu(stage, optimizer):
    got, _ = run_worker("--stage", stage, "--optimizer", optimizer, "--dtype", "fp32")
    assert got["device"] == "cuda"
    assert got["param_max_abs"] <= FP32_TOL, got
    assert got["loss_max_abs"] <= FP32_TOL, got


@pytest.mark.parametrize("stage,comm", [(0, None), (2, None), (2, "bf16"), (1, "fp32"), (3, None)])
def test_bf16_matches_a_master_weight_loop_on_the_gpu(stage, comm):
    got, _ = run_worker("--stage", stage, "--dtype", "bf16", *(("--comm-dtype", comm) if comm else ()))
    assert got["param_max_abs"] <= BF16_PARAM_TOL, got
    for a, b in zip(got["losses"], got["reference_losses"]):
        assert abs(a - b) <= BF16_LOSS_RTOL * max(1.0, abs(b)), got


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_at_most_one_host_synchronization_per_step(stage):
    _, stderr = run_worker("--stage", stage, "--dtype", "bf16", "--count-syncs")
    counts, current = [], None
    for line in stderr.splitlines():
        if line.startswith("tessera-step") or line.startswith("tessera-done"):
            if current is not None:
                counts.append(current)
            current = 0
        elif current is not None and "synchronizing CUDA operation" in line:
            current += 1
    assert counts and max(counts) <= 1, (counts, stderr[-4000:])


# ---- several ranks on one GPU: Gloo with CUDA tensors (collectives staged through pinned host memory)

def _two_ranks_on_the_gpu(worker, cases, tmp_path):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    out = tmp_path / "results.pt"
    # Fresh interpreters: CUDA must not meet a process forked from another (rank_zygote.py).
    check(launch(2, ["tests/python/workers/" + worker, str(path), str(out), "--gloo"], timeout=900,
                 fresh_interpreter=True))
    return torch.load(out)


def test_two_ranks_sharing_the_gpu_over_gloo_match_torch(tmp_path):
    """ZeRO 0-3 on 2 ranks that both use cuda:0 (NCCL refuses two ranks per device): the parity
    worker's TinyNet, and the GPT with its tied head at ZeRO 3, against plain PyTorch on the GPU with
    the CPU parity test's tolerances."""
    import parity_cases as parity
    cases = [parity.case(stage, 2, device="cuda") for stage in (0, 1, 2, 3)] + \
        [parity.case(3, 2, device="cuda", **parity.GPT), parity.case(2, 2, device="cuda", bf16=True, lr=1e-3)]
    results = _two_ranks_on_the_gpu("parity_worker.py", cases, tmp_path)
    for got in results[:4]:
        assert got["dtype"] == "torch.float32"
    for got, c in zip(results[:4], cases):
        parity.compare(got, c)
    parity.compare(results[4], cases[4], param_tol=parity.GPT_PARAM_TOL)
    parity.compare(results[5], cases[5], parity.BF16_PARAM_TOL, parity.BF16_LOSS_TOL, parity.BF16_NORM_RTOL)


def test_one_bit_optimizers_on_cuda_tensors_equal_the_simulation(tmp_path):
    """OneBitAdam, ZeroOneAdam and OneBitLamb with their state and the sign packing on the GPU, 2 ranks
    over Gloo: every compressed step equals the CPU simulation of test_onebit.py."""
    from onebit_cases import CASES, check_against_simulation
    cases = [dict(c, device="cuda") for c in CASES]
    results = _two_ranks_on_the_gpu("onebit_worker.py", cases, tmp_path)
    for c, result in zip(cases, results):
        check_against_simulation(c, result)


def test_one_bit_adam_over_nccl_equals_the_same_run_over_gloo():
    """One rank: NCCL carries the compressed exchange's all-to-all and all-gathers (to itself), Gloo
    the same through host memory; the arithmetic is the same kernels on the same GPU, so the two runs
    agree bit for bit, warm-up and compressed steps alike."""
    runs = {}
    for backend in ("auto", "gloo"):
        runs[backend], _ = run_worker("--optimizer", "OneBitAdam", "--dtype", "bf16", "--backend", backend, "--steps", 8)
    assert runs["auto"]["backend"] == "nccl" and runs["gloo"]["backend"] == "gloo"
    assert runs["auto"]["losses"] == runs["gloo"]["losses"]
    assert runs["auto"]["params"] == runs["gloo"]["params"]
    assert all(math.isfinite(loss) for loss in runs["auto"]["losses"])


def check_against_reference(got, dtype):
    if dtype == "fp32":
        assert got["param_max_abs"] <= FP32_TOL, got
        assert got["loss_max_abs"] <= FP32_TOL, got
    else:
        assert got["param_max_abs"] <= BF16_PARAM_TOL, got
        for a, b in zip(got["losses"], got["reference_losses"]):
            assert abs(a - b) <= BF16_LOSS_RTOL * max(1.0, abs(b)), got


def check_offloaded_run(got, stage, dtype, moved_per_param):
    """An offloaded run against the plain loop (the tolerances of training without offload), and the
    GPU memory allocated after initialize below a run without offload by at least 95% of the bytes
    per parameter the offload moves off the GPU."""
    check_against_reference(got, dtype)
    without, _ = run_worker("--stage", stage, "--dtype", dtype)
    saved = without["allocated_after_init"] - got["allocated_after_init"]
    moved = moved_per_param * got["numel"]
    assert saved >= 0.95 * moved, (saved, moved, got["numel"])


@pytest.mark.parametrize("stage,dtype,pinned", [(1, "fp32", True), (2, "fp32", True), (3, "fp32", True), (2, "bf16", True),
                                                (3, "bf16", True), (2, "bf16", False)])
def test_optimizer_offloaded_to_host_memory_matches_plain_pytorch(stage, dtype, pinned):
    """offload_optimizer.device "cpu" on a GPU rank: the CPU kernel steps the pinned host master from
    the gradient chunks copied off the GPU, and the GPU gets the updated chunks back; the same
    tolerances as without offload, and the optimizer state is off the GPU: after initialize, 8 bytes
    per parameter less allocated than without offload in fp32 (the two moments; the host keeps its
    own fp32 master beside the GPU's values) and 12 in bf16 (the fp32 master too); at stages 2-3 4
    more, the fp32 gradient shard (each reduced chunk goes straight to the host)."""
    got, _ = run_worker("--stage", stage, "--dtype", dtype, "--offload", "pinned" if pinned else "pageable")
    # fp32: the moments (the master stays the GPU's values); bf16: the master too; 2-3: the gradients
    check_offloaded_run(got, stage, dtype, moved_per_param=(8 if dtype == "fp32" else 12) + (4 if stage >= 2 else 0))


@pytest.mark.parametrize("stage,dtype", [(1, "fp32"), (2, "fp32"), (3, "fp32"), (2, "bf16"), (3, "bf16")])
def test_optimizer_offloaded_to_nvme_matches_plain_pytorch(stage, dtype, tmp_path):
    """offload_optimizer.device "nvme" on a GPU rank: the host path above with the optimizer state
    (and in bf16 the fp32 master) in a file under nvme_path, streamed through tile buffers; the same
    tolerances as without offload, the GPU holds no optimizer state (the saving of the cpu test), and
    the file is gone when the engine is."""
    swap = tmp_path / "swap"
    swap.mkdir()
    got, _ = run_worker("--stage", stage, "--dtype", dtype, "--offload", "nvme", "--nvme-path", swap)
    check_offloaded_run(got, stage, dtype, moved_per_param=(8 if dtype == "fp32" else 12) + (4 if stage >= 2 else 0))
    assert list(swap.iterdir()) == []


@pytest.mark.parametrize("dtype,optimizer_offload", [("fp32", "pinned"), ("bf16", "pinned"), ("bf16", "nvme")])
def test_parameters_offloaded_to_host_memory_match_plain_pytorch(dtype, optimizer_offload, tmp_path):
    """offload_param.device "cpu" on a GPU rank (ZeRO-3, with the optimizer on the host): each shard
    lives in pinned host memory, where the CPU optimizer steps it, and goes to its slot of the
    gathered buffer before each allgather; the same tolerances as without offload, and the GPU keeps
    no shard: after initialize 16 bytes per parameter less allocated in fp32 (shard, moments and the
    gradient shard), 18 in bf16 (bf16 shard, fp32 master, moments, gradients)."""
    args = ["--stage", 3, "--dtype", dtype, "--offload", optimizer_offload, "--offload-param"]
    if optimizer_offload == "nvme":
        (tmp_path / "swap").mkdir()
        args += ["--nvme-path", tmp_path / "swap"]
    got, _ = run_worker(*args)
    check_offloaded_run(got, 3, dtype, moved_per_param=16 if dtype == "fp32" else 18)


@pytest.mark.parametrize("dtype,optimizer_offload", [("fp32", "pinned"), ("bf16", "nvme")])
def test_parameters_offloaded_to_nvme_match_plain_pytorch(dtype, optimizer_offload, tmp_path):
    """offload_param.device "nvme" on a GPU rank (ZeRO-3, with the optimizer on the host): each shard
    lives in its file, read through a host swap buffer into its slot of the gathered buffer before
    each allgather and swapped into host memory around its step; the same tolerances as without
    offload, the GPU keeps no shard (the bytes of the host-memory case), and the files are removed."""
    (tmp_path / "params").mkdir()
    args = ["--stage", 3, "--dtype", dtype, "--offload", optimizer_offload, "--offload-param", "nvme",
            "--param-path", tmp_path / "params"]
    if optimizer_offload == "nvme":
        (tmp_path / "swap").mkdir()
        args += ["--nvme-path", tmp_path / "swap"]
    got, _ = run_worker(*args)
    check_offloaded_run(got, 3, dtype, moved_per_param=16 if dtype == "fp32" else 18)
    assert list((tmp_path / "params").iterdir()) == []


@pytest.mark.parametrize("stage,dtype", [(2, "fp32"), (2, "bf16"), (1, "bf16")])
def test_delayed_parameter_update_matches_a_plain_loop_delayed_the_same_way(stage, dtype):
    """offload_optimizer.delayed_param_update after 2 steps: each later host step runs while the next
    forward and backward go on (pinned copies, the CPU on its own thread); the plain loop copies its
    fp32 masters into the model just before each step after the warm-up instead of after it. The
    tolerances of training without offload."""
    got, _ = run_worker("--stage", stage, "--dtype", dtype, "--offload", "pinned", "--delayed", 2, "--steps", 8)
    check_against_reference(got, dtype)


@pytest.mark.parametrize("stage,dtype,clip", [(2, "bf16", 0.0), (1, "fp32", 0.0), (3, "bf16", 0.0), (2, "bf16", 1e-3)])
def test_speculated_host_step_matches_plain_pytorch(stage, dtype, clip):
    """offload_optimizer.super_offload: each bucket's host step runs during the backward, as soon as
    its gradient chunk has landed in pinned memory (a CUDA event), with the step's inputs as they are
    without clipping; the step keeps them, or (clip 1e-3: clipped every step) restores and redoes
    them. The tolerances of training without offload, and every step kept (or every one restored)."""
    got, _ = run_worker("--stage", stage, "--dtype", dtype, "--offload", "pinned", "--super-offload", "--clip", clip)
    check_against_reference(got, dtype)
    steps = len(got["losses"])
    kept, restored = (steps, 0) if clip == 0 else (0, steps)
    assert (got["speculation"]["kept"], got["speculation"]["restored"]) == (kept, restored), got["speculation"]
    assert got["speculation"]["chunks"] > 0


@pytest.mark.parametrize("stage,dtype", [(1, "fp32"), (3, "bf16")])
def test_an_asynchronous_save_from_the_gpu_loads_back_exactly(stage, dtype, tmp_path):
    # checkpoint.async_save: the file's image in pinned host memory, copied from the device, written
    # with O_DIRECT while the next step changes the device's buffers (engine/checkpoint/file_image.h).
    got, _ = run_worker("--stage", stage, "--dtype", dtype, "--async-save", tmp_path / "ckpt")
    assert got["checkpoint_max_abs"] == 0, got
    assert got["param_max_abs"] <= (FP32_TOL if dtype == "fp32" else BF16_PARAM_TOL), got


def test_the_accelerator_answers_for_the_gpu():
    """tessera.accelerator on a GPU machine: CUDA's names, NCCL, torch.cuda's figures."""
    from tessera.accelerator import get_accelerator
    acc = get_accelerator()
    assert acc.device_name() == "cuda" and acc.device_name(0) == "cuda:0"
    assert acc.communication_backend_name() == "nccl" and not acc.is_synchronized_device()
    assert acc.device_count() == torch.cuda.device_count() and acc.is_available()
    acc.set_device(0)
    assert acc.current_device() == 0 and acc.current_device_name() == "cuda:0"
    assert acc.is_bf16_supported() == torch.cuda.is_bf16_supported() and acc.is_fp16_supported()
    x = acc.FloatTensor([1.0, 2.0])
    assert x.is_cuda and acc.on_accelerator(x)
    acc.reset_peak_memory_stats()
    held = torch.empty(1 << 22, device="cuda")  # 16 MiB
    acc.synchronize()
    assert acc.max_memory_allocated() >= 16 << 20 and acc.memory_allocated() >= 16 << 20
    del held
    acc.empty_cache()
    assert 0 < acc.available_memory() <= acc.total_memory()
    assert acc.pin_memory(torch.ones(4)).is_pinned()
