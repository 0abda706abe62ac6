"""Checkpoints through the Python API (engine/checkpoint/, docs/checkpoints.md), on 1, 2 and 4
ranks (tests/python/workers/checkpoint_worker.py):

  exact resume   N steps, save, load in a fresh job, M more steps == N + M steps uninterrupted:
                 every loss and every saved tensor (weights, optimizer state, the 1-bit family's
                 error buffers, the loss scaler) bit-identical, for ZeRO 0-3 and each optimizer
  resharding     a checkpoint loads at another data-parallel size and ZeRO stage: the weights and
                 optimizer state read back are bit-identical to those saved (compared by saving
                 again at once), and training goes on within the parity tolerances
  bad input      a damaged or truncated file, another model, another optimizer: an error naming the
                 file and the parameter, and the engine unchanged on every rank
  crashes        SIGKILL at each point of a save: `latest` names a checkpoint that loads
  disk full      a save into a full tmpfs fails clearly and leaves the previous checkpoint intact
  export         `tessera checkpoint export` / save_16bit_model files load into the module with
                 load_state_dict; `inspect` verifies every checksum

The saved tensors are read back with the safetensors package, not with tessera's reader.
"""
import copy
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from checkpoint_cases import TINY, assert_same, config, consolidated, run_hops, run_jobs
from conftest import CLI, ROOT, child_env, free_port

# ---- exact resume ---------------------------------------------------------------------------------

RESUME_CASES = {
    "adam_zero0": dict(TINY, config=config(0, {"type": "Adam", "params": {"lr": 3e-3}})),
    "adamw_zero1_warmup": dict(TINY, config=config(1, scheduler={"type": "WarmupLR", "params": {
        "warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 4}})),
    "sgd_zero2_gas": dict(TINY, micro=1, config=config(2, {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}})),
    "adamw_zero3_gpt": dict(TINY, model="gpt", config=config(3)),
    "lamb_zero1": dict(TINY, config=config(1, {"type": "Lamb", "params": {"lr": 1e-2, "weight_decay": 0.01}})),
    "fp16_dynamic_zero2": dict(TINY, config=config(2, fp16={"enabled": True, "initial_scale_power": 16,
                                                            "loss_scale_window": 2, "hysteresis": 2})),
    "onebit_adam": dict(TINY, config=config(0, {"type": "OneBitAdam", "params": {"lr": 3e-3, "freeze_step": 2}})),
    "zero_one_adam": dict(TINY, config=config(0, {"type": "ZeroOneAdam", "params": {
        "lr": 3e-3, "var_freeze_step": 3, "var_update_scaler": 1, "local_step_scaler": 2, "local_step_clipper": 2}})),
    "onebit_lamb": dict(TINY, config=config(0, {"type": "OneBitLamb", "params": {"lr": 1e-2, "freeze_step": 2}})),
    # A client torch optimizer run as given over the shards: its state made at the resumed run's load.
    "client_rmsprop_zero2": dict(TINY, config=config(2, None), client={"type": "RMSprop", "lr": 1e-3, "momentum": 0.9}),
    # NVMe optimizer offload: the moments and the bf16 run's fp32 master are in the swap files.
    "adamw_zero2_nvme_bf16": dict(TINY, config=config(2, bf16={"enabled": True}), nvme=True),
    "adamw_zero1_nvme_fp32": dict(TINY, config=config(1), nvme=True),
    # ZeRO-Infinity: the parameter shards in files too (the save brings them into memory).
    "adamw_zero3_gpt_infinity_fp32": dict(TINY, model="gpt", config=config(3), nvme="infinity"),
    "adamw_zero3_gpt_infinity_bf16": dict(TINY, model="gpt", config=config(3, bf16={"enabled": True}), nvme="infinity"),
}


def with_nvme(run, folder):
    """A run whose case asks for NVMe optimizer offload gets swap files of its own under `folder`
    ("infinity": the parameters' too)."""
    run = copy.deepcopy(run)
    nvme = run.pop("nvme", False)
    if nvme:
        folder.mkdir(parents=True, exist_ok=True)
        zero = run["config"]["zero_optimization"]
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": str(folder), "buffer_count": 2}
        zero["sub_group_size"] = 500  # several tiles per bucket
        if nvme == "infinity":
            zero["offload_param"] = {"device": "nvme", "nvme_path": str(folder), "buffer_count": 2}
    return run
FIRST, SECOND = 3, 3


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    names = sorted(RESUME_CASES)
    case = {n: with_nvme(RESUME_CASES[n], tmp / "swap" / n) for n in names}
    full = [dict(case[n], steps=FIRST + SECOND, save=str(tmp / "full" / n)) for n in names]
    first = [dict(case[n], steps=FIRST, save=str(tmp / "half" / n)) for n in names]
    second = [dict(case[n], steps=SECOND, load={"dir": str(tmp / "half" / n)}, save=str(tmp / "resumed" / n))
              for n in names]
    results = {}
    for label, runs in (("full", full), ("first", first), ("second", second)):
        for n, r in zip(names, run_jobs(tmp, 2, runs, label)):
            results.setdefault(n, {})[label] = r
    return tmp, results


@pytest.mark.parametrize("name", sorted(RESUME_CASES))
def test_resume_is_bit_exact(resumed, name):
    tmp, results = resumed
    full, first, second = results[name]["full"], results[name]["first"], results[name]["second"]
    assert second["loaded"].endswith("global_step%d" % FIRST)
    assert second["client_state"] == {"next_step": FIRST, "note": "data"}
    assert second["global_steps_at_start"] == FIRST
    assert first["losses"] + second["losses"] == full["losses"], name
    assert second["norms"] == full["norms"][FIRST:]
    assert (second["loss_scale"], second["lr"], second["skipped_steps"]) == (full["loss_scale"], full["lr"], full["skipped_steps"])
    step = "global_step%d" % (FIRST + SECOND)
    meta_full, a = consolidated(str(tmp / "full" / name / step))
    meta_resumed, b = consolidated(str(tmp / "resumed" / name / step))
    assert_same(a, b, where=name)  # weights, every optimizer state, error buffers, RNG
    assert meta_full["engine"] == meta_resumed["engine"]
    if name == "fp16_dynamic_zero2":  # the scaler's state matters: overflows before the save, applied steps too
        assert 0 < first["skipped_steps"] < FIRST, first


# The GPU ranks' host path (the optimizer on the host: cpu or nvme; at ZeRO-3 the shards in host
# memory too), run on CPU ranks with TESSERA_HOST_STAGING=1 (docs/offload.md): the host copies
# are refreshed from a load and saved from where they are, so a resumed run is bit-exact too.
HOST_PATH_CASES = {
    "host_cpu_zero2_bf16": dict(TINY, config=config(2, bf16={"enabled": True},
                                                  zero_extra={"offload_optimizer": {"device": "cpu"}})),
    "host_nvme_zero1_fp32": dict(TINY, config=config(1), nvme=True),
    "host_cpu_params_zero3_gpt_fp32": dict(TINY, model="gpt", config=config(3, zero_extra={
        "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}})),
    "host_nvme_params_zero3_gpt_bf16": dict(TINY, model="gpt", config=config(3, bf16={"enabled": True}, zero_extra={
        "offload_param": {"device": "cpu"}}), nvme=True),
    # The delayed parameter update from step 4 on (the resumed run counts its warm-up from the
    # checkpoint's step); the last save finishes the running update before it reads the state.
    "host_cpu_delayed_zero2_bf16": dict(TINY, config=config(2, bf16={"enabled": True}, zero_extra={
        "offload_optimizer": {"device": "cpu", "delayed_param_update": {"enabled": True, "warmup_steps": 3}}})),
}


def test_resume_on_the_gpu_ranks_host_path_is_bit_exact(tmp_path, monkeypatch):
    monkeypatch.setenv("TESSERA_HOST_STAGING", "1")
    # In this order: the tiny model seeds the global RNG first, which the GPT's construction leaves
    # alone, so the RNG state each checkpoint saves is the same in every job.
    names = list(HOST_PATH_CASES)
    case = {n: with_nvme(HOST_PATH_CASES[n], tmp_path / "swap" / n) for n in names}
    runs = {"full": [dict(case[n], steps=FIRST + SECOND, save=str(tmp_path / "full" / n)) for n in names],
            "first": [dict(case[n], steps=FIRST, save=str(tmp_path / "half" / n)) for n in names],
            "second": [dict(case[n], steps=SECOND, load={"dir": str(tmp_path / "half" / n)},
                            save=str(tmp_path / "resumed" / n)) for n in names]}
    results = {label: dict(zip(names, run_jobs(tmp_path, 2, r, label))) for label, r in runs.items()}
    for n in names:
        full, first, second = results["full"][n], results["first"][n], results["second"][n]
        assert first["losses"] + second["losses"] == full["losses"], n
        assert second["norms"] == full["norms"][FIRST:], n
        step = "global_step%d" % (FIRST + SECOND)
        _, a = consolidated(str(tmp_path / "full" / n / step))
        _, b = consolidated(str(tmp_path / "resumed" / n / step))
        assert_same(a, b, where=n)


def test_pipeline_resume_is_bit_exact(tmp_path):
    """tessera.pipe on 2 stages at ZeRO 1 (tied embeddings on both): 2 + 2 steps equal 4 uninterrupted."""
    run = {"model": "pipe", "stages": 2, "config": config(1, {"type": "AdamW", "params": {"lr": 1e-2, "eps": 1e-4}})}
    full = run_jobs(tmp_path, 2, [dict(run, steps=4, save=str(tmp_path / "full"))], "full")[0]
    first = run_jobs(tmp_path, 2, [dict(run, steps=2, save=str(tmp_path / "half"))], "first")[0]
    second = run_jobs(tmp_path, 2, [dict(run, steps=2, load={"dir": str(tmp_path / "half")},
                                         save=str(tmp_path / "resumed"))], "second")[0]
    assert first["losses"] + second["losses"] == full["losses"]
    assert second["norms"] == full["norms"][2:]
    meta, a = consolidated(str(tmp_path / "full" / "global_step4"))
    _, b = consolidated(str(tmp_path / "resumed" / "global_step4"))
    assert_same(a, b)
    assert meta["layout"]["pipeline_parallel"] == 2 and {p["pipeline_stage"] for p in meta["parameters"]} == {0, 1}
    assert len([k for k in a if k.startswith("fp32/")]) == len(meta["parameters"])


def test_the_1bit_error_buffers_are_saved_per_rank(resumed):
    tmp, _ = resumed
    _, saved = consolidated(str(tmp / "half" / "onebit_adam" / ("global_step%d" % FIRST)))
    errors = [k for k in saved if "local/" in k]
    assert len(errors) == 4, errors  # worker and server error of each of the 2 ranks
    assert all(saved[k].abs().sum() > 0 for k in errors if "worker_error" in k)


# ---- resharding -----------------------------------------------------------------------------------

def chain(tmp, hops, base, steps_per_hop=2, first=3):
    """run_hops over (dp, stage[, nvme]) hops of `base`. Returns the results, with the uninterrupted run."""
    runs = []
    for i, hop in enumerate(hops):
        run = copy.deepcopy(base)
        run["config"]["zero_optimization"]["stage"] = hop[1]
        if len(hop) > 2:  # "nvme": the optimizer's state in files; "infinity": the parameters' too
            run = with_nvme(dict(run, nvme=hop[2]), tmp / ("swap%d" % i))
        runs.append((hop[0], run))
    results = run_hops(tmp, runs, first, steps_per_hop)
    reference = copy.deepcopy(base)
    reference["config"]["zero_optimization"]["stage"] = hops[0][1]
    reference["steps"] = first + steps_per_hop * (len(hops) - 1)
    results.append(run_jobs(tmp, hops[0][0], [reference], "reference")[0])
    return results


def check_chain(tmp, hops, results, first=3, steps_per_hop=2, loss_rtol=2e-6):
    reference = results[-1]
    losses = results[0]["losses"]
    for i in range(1, len(hops)):
        step = first + steps_per_hop * (i - 1)
        tag = "global_step%d" % step
        meta_saved, saved = consolidated(str(tmp / ("hop%d" % (i - 1)) / tag))
        meta_loaded, loaded = consolidated(str(tmp / ("hop%d_loaded" % i) / tag))
        assert meta_loaded["layout"]["data_parallel"] == hops[i][0] and meta_loaded["layout"]["zero_stage"] == hops[i][1]
        keys = [k for k in saved if k.split("/")[0] in meta_saved["layout"]["states"] or k.startswith("group/")]
        assert len(keys) > 8
        assert_same(saved, loaded, keys, where="hop %d %s" % (i, hops[i]))
        assert results[i]["global_steps_at_start"] == step
        assert results[i]["client_state"]["next_step"] == step
        losses = losses + results[i]["losses"]
    assert len(losses) == len(reference["losses"])
    for got, want in zip(losses, reference["losses"]):
        assert abs(got - want) <= loss_rtol * max(1.0, abs(want)), (losses, reference["losses"])
    assert results[-2]["lr"] == pytest.approx(reference["lr"], rel=1e-12)


def test_reshard_dp_2_1_4_and_zero_2_0_1_3_with_adamw_and_a_schedule(tmp_path):
    base = dict(TINY, config=config(2, scheduler={"type": "WarmupDecayLR", "params": {
        "warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 3, "total_num_steps": 20}}))
    hops = [(2, 2), (1, 0), (4, 1), (2, 3)]
    check_chain(tmp_path, hops, chain(tmp_path, hops, base))


def test_reshard_with_sgd_momentum_dp_1_to_2(tmp_path):
    base = dict(TINY, config=config(0, {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}))
    hops = [(1, 0), (2, 2)]
    check_chain(tmp_path, hops, chain(tmp_path, hops, base))


def test_reshard_in_and_out_of_nvme_offload(tmp_path):
    base = dict(TINY, config=config(2, bf16={"enabled": True}))
    hops = [(2, 2, "nvme"), (1, 1), (2, 3, "infinity"), (1, 3)]
    check_chain(tmp_path, hops, chain(tmp_path, hops, base), loss_rtol=1e-2)


def test_reshard_with_a_client_adagrad_dp_2_1_2_and_zero_2_0_3(tmp_path):
    """A client torch.optim.Adagrad (run as given over the shards): its "sum" reshards like the
    engine's own moments, its "step" is saved once per group and loads into ZeRO-3's split groups
    (matrices partitioned, vectors persistent: threshold 100)."""
    base = dict(TINY, config=config(2, None), client={"type": "Adagrad", "lr": 1e-2})
    base["config"]["zero_optimization"]["stage3_param_persistence_threshold"] = 100
    hops = [(2, 2), (1, 0), (2, 3)]
    results = chain(tmp_path, hops, base)
    check_chain(tmp_path, hops, results)
    meta, saved = consolidated(str(tmp_path / "hop0" / "global_step3"))
    assert meta["layout"]["optimizer"] == "torch.optim.Adagrad" and "sum" in meta["layout"]["states"]
    steps = [v for k, v in saved.items() if k.startswith("group/") and k.endswith("/step")]
    assert steps and all(float(v) == 3 for v in steps), steps


def test_1bit_adam_at_another_dp_size_starts_its_error_buffers_from_zero(tmp_path):
    base = dict(TINY, config=config(0, {"type": "OneBitAdam", "params": {"lr": 3e-3, "freeze_step": 2}}))
    hops = [(2, 0), (1, 0)]
    results = chain(tmp_path, hops, base)
    _, saved = consolidated(str(tmp_path / "hop0" / "global_step3"))
    _, loaded = consolidated(str(tmp_path / "hop1_loaded" / "global_step3"))
    assert_same(saved, loaded, [k for k in saved if k.startswith(("fp32/", "exp_avg"))])
    assert not [k for k in loaded if "local/" in k]  # one rank: no compression, no error buffers


# ---- bad input ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved_tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    run_jobs(tmp, 2, [dict(TINY, config=config(1), steps=2, save=str(tmp / "good"))], "save")
    return tmp


def damaged(saved_tiny, name, change):
    target = saved_tiny / name
    if not target.exists():
        shutil.copytree(saved_tiny / "good", target)
        change(target / "global_step2")
    return str(target)


def flip_a_byte(ckpt):
    path = ckpt / "rank00001.safetensors"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x40
    path.write_bytes(bytes(data))


def truncate(ckpt):
    path = ckpt / "rank00000.safetensors"
    path.write_bytes(path.read_bytes()[:-64])


def test_damaged_files_and_other_models_give_clear_errors_and_change_nothing(saved_tiny):
    good = str(saved_tiny / "good")
    cases = [
        (damaged(saved_tiny, "flipped", flip_a_byte), {}, ["rank00001.safetensors", "fails its checksum"]),
        (damaged(saved_tiny, "truncated", truncate), {}, ["rank00000.safetensors", "truncated"]),
        (good, {"wider": True}, ["fc2.weight with shape [32, 32]", "the model's is [33, 32]"]),
        (good, {"renamed": True}, ["no parameter extra.weight", "load_module_strict=False"]),
        (good, {"config": config(1, {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}})},
         ["holds AdamW state", "load_optimizer_states=False"]),
        (good, {"tag": "global_step9"}, ["no checkpoint \"global_step9\""]),
    ]
    runs = []
    for where, change, _ in cases:
        change = dict(change)
        run = dict(TINY, config=config(1), steps=0, load={"dir": where}, expect_error=True)
        if "tag" in change:
            run["load"]["tag"] = change.pop("tag")
        run.update(change)
        runs.append(run)
    results = run_jobs(saved_tiny, 2, runs, "errors")
    for (where, change, words), r in zip(cases, results):
        assert r["error"], (where, change)
        for w in words:
            assert w in r["error"], (w, r["error"])
        assert r["unchanged"] and r["global_steps"] == 0, r


def test_strictness_and_partial_loads(saved_tiny):
    good = str(saved_tiny / "good")
    runs = [
        dict(TINY, config=config(1), steps=1, renamed=True, load={"dir": good, "load_module_strict": False}),
        dict(TINY, config=config(1, {"type": "SGD", "params": {"lr": 0.1}}), steps=1,
             load={"dir": good, "load_optimizer_states": False}),
        dict(TINY, config=config(1), steps=1, load={"dir": good, "load_module_only": True}),
        # No `latest` there: DeepSpeed's (None, None), training from scratch.
        dict(TINY, config=config(1), steps=1, load={"dir": str(saved_tiny / "empty")}),
    ]
    results = run_jobs(saved_tiny, 2, runs, "partial")
    assert [r["global_steps_at_start"] for r in results] == [2, 2, 0, 0]
    assert all(r["losses"] for r in results)
    assert results[3]["loaded"] is None and results[3]["client_state"] is None


def test_an_unexpected_parameter_is_an_error_when_strict(saved_tiny):
    run_jobs(saved_tiny, 2, [dict(TINY, config=config(1), steps=1, renamed=True, save=str(saved_tiny / "extra"))], "extra")
    runs = [dict(TINY, config=config(1), steps=0, load={"dir": str(saved_tiny / "extra")}, expect_error=True),
            dict(TINY, config=config(1), steps=1, load={"dir": str(saved_tiny / "extra"), "load_module_strict": False})]
    results = run_jobs(saved_tiny, 2, runs, "unexpected")
    assert "the model does not have (extra.bias, extra.weight)" in results[0]["error"], results[0]["error"]
    assert results[0]["unchanged"]
    assert results[1]["global_steps_at_start"] == 1


# ---- crashes and a full disk -----------------------------------------------------------------------

POINTS = ["after_shard_write", "before_commit", "after_fsync", "after_rename", "after_latest"]


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async_save"])
def test_a_kill_at_any_point_of_a_save_leaves_a_loadable_latest(tmp_path, background):
    """async_save: the crash points are reached by the save's own thread while the run goes on."""
    crashing = config(2, checkpoint={"async_save": True}) if background else config(2)
    for point in POINTS:
        runs = [dict(TINY, config=config(2), steps=2, save=str(tmp_path / point)),
                dict(TINY, config=crashing, steps=1, load={"dir": str(tmp_path / point)}, save=str(tmp_path / point),
                     crash=point)]
        result = run_jobs(tmp_path, 2, runs, "crash_" + point, expect_ok=False)
        # 128 + SIGKILL: the crash point was reached, not some earlier failure.
        assert result.returncode == 137, (point, result.returncode, result.stdout[-3000:], result.stderr[-3000:])
    verify = [dict(TINY, config=config(2), steps=1, load={"dir": str(tmp_path / p)}) for p in POINTS]
    results = run_jobs(tmp_path, 2, verify, "verify")
    for point, r in zip(POINTS, results):
        latest = (tmp_path / point / "latest").read_text()
        assert r["loaded"].endswith(latest), (point, r["loaded"], latest)
        assert latest == ("global_step3" if point == "after_latest" else "global_step2"), (point, latest)


def test_ten_kills_at_random_moments_leave_a_loadable_latest(tmp_path):
    """A 2-rank job saving after every step (checkpoint.save_interval 1), the launcher and both ranks
    killed with SIGKILL at a random moment after the first checkpoint is complete."""
    rng = random.Random(18)
    dirs = []
    for i in range(10):
        save_dir = tmp_path / ("kill%d" % i)
        run = dict(TINY, model="gpt", steps=10000,
                   config=config(2, checkpoint={"save_interval": 1, "save_dir": str(save_dir)}))
        spec = tmp_path / ("kill%d.json" % i)
        spec.write_text(json.dumps([run]))
        cmd = [CLI, "launch", "--nproc-per-node", "2", "--master-port", str(free_port()), "--", sys.executable,
               "tests/python/workers/checkpoint_worker.py", str(spec), str(tmp_path / "unused.json")]
        job = subprocess.Popen(cmd, env=child_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        deadline = time.time() + 60
        while not (save_dir / "latest").exists() and time.time() < deadline and job.poll() is None:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.5))
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        assert (save_dir / "latest").exists(), i
        dirs.append(save_dir)
    results = run_jobs(tmp_path, 2, [dict(TINY, model="gpt", config=config(2), steps=0, load={"dir": str(d)})
                                     for d in dirs], "verify")
    for d, r in zip(dirs, results):
        latest = (d / "latest").read_text()
        assert r["loaded"] == str(d / latest), (r["loaded"], latest)
        assert r["global_steps_at_start"] == int(latest[len("global_step"):])


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async_save"])
def test_a_full_disk_fails_the_save_and_keeps_the_previous_checkpoint(tmp_path, background):
    """async_save: the second save returns, its thread fails, and engine.close() raises the error on
    every rank."""
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unshare -m is not permitted here (needs root): %s" % probe.stderr.decode().strip())
    mount = tmp_path / "small"
    mount.mkdir()
    first = [dict(TINY, config=config(1), steps=2, save=str(mount / "ckpt"))]
    # The second save holds the model twice over (another tag): the tmpfs has room for one.
    second = [dict(TINY, config=config(1, checkpoint={"async_save": background}), steps=1,
                   load={"dir": str(mount / "ckpt")}, save=str(mount / "ckpt"))]
    verify = [dict(TINY, config=config(1), steps=1, load={"dir": str(mount / "ckpt")})]
    for name, runs in (("first", first), ("second", second), ("verify", verify)):
        (tmp_path / (name + ".json")).write_text(json.dumps(runs))

    def job(name):
        return " ".join([CLI, "launch", "--nproc-per-node", "2", "--master-port", str(free_port()), "--timeout", "120",
                         "--", sys.executable, "tests/python/workers/checkpoint_worker.py", str(tmp_path / (name + ".json")),
                         str(tmp_path / (name + ".out.json"))])
    script = ("mount -t tmpfs -o size=96k tmpfs %s && %s; echo first=$?; %s; echo second=$?; %s; echo verify=$?; "
              "cat %s/ckpt/latest; ls -a %s/ckpt" % (mount, job("first"), job("second"), job("verify"), mount, mount))
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], env=child_env(), cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    out = result.stdout
    assert "first=0" in out and "verify=0" in out, out + result.stderr
    assert "second=0" not in out, out
    assert "No space left on device" in result.stdout + result.stderr, out + result.stderr
    assert "global_step2" in out.split("verify=0")[1]
    loaded = json.loads((tmp_path / "verify.out.json").read_text())[0]["loaded"]
    assert loaded.endswith("global_step2")


# ---- export, inspect, save_16bit_model, periodic saves ----------------------------------------------

@pytest.fixture(scope="module")
def gpt_checkpoint(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    run = dict(TINY, model="gpt", config=config(3, bf16={"enabled": True}), steps=2, save=str(tmp / "ckpt"),
               save_16bit=str(tmp / "model16"))
    run_jobs(tmp, 2, [run], "save")
    return tmp


def cli(*args):
    return subprocess.run([CLI] + [str(a) for a in args], capture_output=True, text=True, timeout=120)


def test_export_loads_into_the_module_with_load_state_dict(gpt_checkpoint):
    from parity_worker import TinyGpt
    out = gpt_checkpoint / "model.safetensors"
    r = cli("checkpoint", "export", gpt_checkpoint / "ckpt", "-o", out)
    assert r.returncode == 0, r.stderr
    _, saved = consolidated(str(gpt_checkpoint / "ckpt" / "global_step2"))
    model = TinyGpt(0)
    state = load_file(str(out))
    model.load_state_dict(state, strict=True)
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), saved["fp32/" + name]), name
    # bf16, several files with an index
    (gpt_checkpoint / "split").mkdir(exist_ok=True)
    r = cli("checkpoint", "export", gpt_checkpoint / "ckpt", "--tag", "global_step2", "-o",
            gpt_checkpoint / "split" / "model.safetensors", "--dtype", "bf16", "--max-shard-size", "20KB")
    assert r.returncode == 0, r.stderr
    index = json.load(open(gpt_checkpoint / "split" / "model.safetensors.index.json"))
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1
    merged = {}
    for f in files:
        merged.update(load_file(str(gpt_checkpoint / "split" / f)))
    assert set(merged) == set(state)
    for k, v in merged.items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, state[k].to(torch.bfloat16)), k


def test_save_16bit_model_is_the_modules_bf16_weights(gpt_checkpoint):
    from parity_worker import TinyGpt
    state = load_file(str(gpt_checkpoint / "model16" / "model.safetensors"))
    _, saved = consolidated(str(gpt_checkpoint / "ckpt" / "global_step2"))
    model = TinyGpt(0).to(torch.bfloat16)
    model.load_state_dict(state, strict=True)
    for name, v in state.items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, saved["compute/" + name]), name


def test_inspect_verifies_every_checksum(gpt_checkpoint):
    r = cli("checkpoint", "inspect", gpt_checkpoint / "ckpt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "global_step2 (latest)" in r.stdout and "all checksums match" in r.stdout
    assert "ZeRO 3" in r.stdout and "transformer.wte.weight" in r.stdout
    bad = gpt_checkpoint / "bad"
    shutil.copytree(gpt_checkpoint / "ckpt", bad)
    flip_a_byte(bad / "global_step2")
    r = cli("checkpoint", "inspect", bad)
    assert r.returncode == 1 and "FAILED" in r.stdout and "fails its checksum" in r.stdout, r.stdout


def test_periodic_saves_follow_save_interval(tmp_path):
    run = dict(TINY, config=config(1, checkpoint={"save_interval": 2, "save_dir": str(tmp_path / "periodic")}), steps=5)
    run_jobs(tmp_path, 2, [run])
    assert sorted(os.listdir(tmp_path / "periodic")) == ["global_step2", "global_step4", "latest"]
    assert (tmp_path / "periodic" / "latest").read_text() == "global_step4"
