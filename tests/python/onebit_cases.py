"""The 1-bit optimizers' cases and the check of a run against the plain PyTorch simulation
(tests/python/optim/test_onebit.py; test_gpu.py runs the same cases on CUDA tensors)."""
W, C, L = "warm-up", "compressed", "local"
CASES = [
    {"type": "OneBitAdam", "lr": 1e-2, "weight_decay": 0.01, "clip": 0.5, "seed": 3, "steps": 8,
     "params": {"freeze_step": 3},
     "phases": [W] * 3 + [C] * 5},
    # Small scalers, so 20 steps see every branch: full-precision variance updates whose interval
    # doubles (t = 1, 2, 4, 6, 8), 1-bit gradient steps between them, then local steps whose sync
    # interval grows 1 -> 2 -> 4.
    {"type": "ZeroOneAdam", "lr": 1e-2, "weight_decay": 0.01, "clip": 0.5, "seed": 4, "steps": 20,
     "params": {"var_freeze_step": 10, "var_update_scaler": 2, "local_step_scaler": 3, "local_step_clipper": 4},
     "phases": [W, W, C, W, C, W, C, W, C, C, C, C, C, C, L, C, L, L, L, C]},
    {"type": "OneBitLamb", "lr": 1e-2, "weight_decay": 0.01, "clip": 0.5, "seed": 5, "steps": 8,
     "params": {"freeze_step": 3},
     "phases": [W] * 3 + [C] * 5},
]


def check_against_simulation(case, result):
    """One case's result from onebit_worker.py (also used by test_gpu.py's run on CUDA tensors)."""
    assert result["phases"] == case["phases"]
    assert result["simulated"] == sum(p != W for p in case["phases"]) + (
        sum(p == W for p in case["phases"]) if case["type"] == "ZeroOneAdam" else 0)
    worst = result["worst"]
    assert worst["params"] < 1e-6, worst
    assert worst["exp_avg"] < 1e-6, worst
    assert worst["errors"] < 1e-6, worst
    assert worst["norm"] < 1e-5, worst
    for key in ("momentum_accumulator", "exp_avg_sq_fresh", "counters", "last_factor"):
        assert worst.get(key, 0.0) < 1e-6, worst
