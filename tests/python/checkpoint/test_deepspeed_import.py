"""DeepSpeed checkpoints into tessera (python/tessera/deepspeed_checkpoint.py, `tessera checkpoint
import-deepspeed`): DeepSpeed 0.19.8 from PyPI, in its own venv (bench/setup_deepspeed.sh), trains
the example GPT on 2 ranks, saves, loads its own checkpoint and trains 20 more steps; tessera
imports the checkpoint, loads it at another ZeRO stage (and number of ranks) and trains the same
20 steps. The losses, the learning rate, the step counters and the loss scale must be DeepSpeed's
own after its load (fp32 within 1e-4 relative; bf16 and fp16 within 2e-3, where the two engines'
16-bit arithmetic differs). A wrong weight, moment, Adam step count or schedule step shows in
the losses from the first step on (AdamW with a warmup that changes the rate every step)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import CLI, ROOT, check, child_env, free_port, peer_python

WORKER = os.path.join(ROOT, "tests", "python", "workers", "deepspeed_checkpoint_worker.py")
PROJECT_PYTHON = sys.executable


@pytest.fixture(scope="module")
def deepspeed_python():
    return peer_python("TESSERA_DEEPSPEED_PYTHON", "setup_deepspeed.sh")


def run(python, nproc, impl, spec, tmp_path, name):
    spec_path, out = tmp_path / (name + ".spec.json"), tmp_path / (name + ".json")
    spec_path.write_text(json.dumps(spec))
    cmd = [CLI, "launch", "--nproc-per-node", str(nproc), "--master-port", str(free_port()), "--timeout", "120",
           "--", python, WORKER, impl, str(spec_path), str(out)]
    check(subprocess.run(cmd, env=child_env(DS_ACCELERATOR="cpu"), cwd=ROOT, capture_output=True, text=True,
                         timeout=300))
    return json.loads(out.read_text())


def deepspeed_run(python, tmp_path, stage, dtype):
    spec = {"seed": 5, "micro": 2, "accumulation": 2, "dtype": dtype, "stage": stage, "steps": 6, "more": 20,
            "save_dir": str(tmp_path / "deepspeed")}
    return spec, run(python, 2, "deepspeed", spec, tmp_path, "deepspeed")


@pytest.fixture(scope="module")
def zero2_fp32(deepspeed_python, tmp_path_factory):
    """DeepSpeed's ZeRO-2 fp32 run: (spec, its results); its checkpoint in spec["save_dir"]."""
    return deepspeed_run(deepspeed_python, tmp_path_factory.mktemp("zero2"), stage=2, dtype="fp32")


def tessera_run(spec, tmp_path, load_dir, stage, nproc=2):
    spec = dict(spec, load_dir=str(load_dir), tessera_stage=stage, micro=spec["micro"] * 2 // nproc)
    return run(PROJECT_PYTHON, nproc, "tessera", spec, tmp_path, "tessera")


def assert_follows(tessera, deepspeed, rtol):
    assert tessera["steps"] == deepspeed["steps"] and tessera["skipped"] == deepspeed["skipped"]
    assert tessera["lr"] == pytest.approx(deepspeed["lr"], rel=1e-12)
    assert tessera["scale"] == deepspeed["scale"]
    worst = max(abs(a - b) / abs(b) for a, b in zip(tessera["losses"], deepspeed["losses"]))
    assert len(tessera["losses"]) == len(deepspeed["losses"]) == 20
    assert worst <= rtol, "losses after the load differ by %.2e relative:\ntessera   %s\ndeepspeed %s" % (
        worst, tessera["losses"], deepspeed["losses"])


def test_zero2_fp32_imported_by_the_command_continues_on_one_rank(zero2_fp32, tmp_path):
    spec, ds = zero2_fp32
    out = tmp_path / "imported"
    r = subprocess.run([CLI, "checkpoint", "import-deepspeed", spec["save_dir"], str(out)], env=child_env(),
                       capture_output=True, text=True, timeout=120)
    check(r)
    assert "ZeRO 2, 2 ranks, fp32, AdamW, 28 parameters) at step 6" in r.stdout
    meta = json.load(open(out / "global_step6" / "metadata.json"))
    assert meta["layout"]["states"] == ["fp32", "exp_avg", "exp_avg_sq"] and len(meta["files"]) == 2
    assert (out / "latest").read_text().strip() == "global_step6"
    # DeepSpeed's ranks' partitions kept as they were cut: a parameter split between them has two shards.
    assert any(len(p["shards"]) == 2 for p in meta["parameters"])
    assert_follows(tessera_run(spec, tmp_path, out, stage=1, nproc=1), ds, rtol=1e-4)


def test_zero3_fp32_continues_at_zero3(deepspeed_python, tmp_path):
    from tessera.deepspeed_checkpoint import import_deepspeed
    spec, ds = deepspeed_run(deepspeed_python, tmp_path, stage=3, dtype="fp32")
    path = import_deepspeed(spec["save_dir"], str(tmp_path / "imported"), verbose=False)
    assert path.endswith("global_step6")
    assert_follows(tessera_run(spec, tmp_path, tmp_path / "imported", stage=3), ds, rtol=1e-4)


def test_zero1_bf16_continues_at_zero2(deepspeed_python, tmp_path):
    from tessera.deepspeed_checkpoint import import_deepspeed
    spec, ds = deepspeed_run(deepspeed_python, tmp_path, stage=1, dtype="bf16")
    assert any(n.startswith("bf16_") for n in os.listdir(os.path.join(spec["save_dir"], "global_step6")))
    import_deepspeed(spec["save_dir"], str(tmp_path / "imported"), verbose=False)
    meta = json.load(open(tmp_path / "imported" / "global_step6" / "metadata.json"))
    assert meta["layout"]["compute_dtype"] == "bf16" and meta["parameters"][0]["dtype"] == "BF16"
    assert_follows(tessera_run(spec, tmp_path, tmp_path / "imported", stage=2), ds, rtol=2e-3)


def test_zero3_fp16_brings_the_loss_scaler_and_skipped_steps(deepspeed_python, tmp_path):
    from tessera.deepspeed_checkpoint import import_deepspeed
    spec, ds = deepspeed_run(deepspeed_python, tmp_path, stage=3, dtype="fp16")
    at_save = ds["at_save"]
    assert at_save["skipped"] > 0, "the first steps overflow at 2^20: the test needs skipped steps before the save"
    import_deepspeed(spec["save_dir"], str(tmp_path / "imported"), verbose=False)
    engine = json.load(open(tmp_path / "imported" / "global_step6" / "metadata.json"))["engine"]
    assert engine["skipped_steps"] == at_save["skipped"]
    assert engine["loss_scaler"] == {"type": "dynamic", "scale": at_save["scale"], "cur_iter": at_save["cur_iter"],
                                     "last_overflow_iter": at_save["last_overflow_iter"],
                                     "cur_hysteresis": at_save["cur_hysteresis"]}
    assert_follows(tessera_run(spec, tmp_path, tmp_path / "imported", stage=1), ds, rtol=2e-3)


def test_what_is_not_a_tessera_checkpoint_is_refused_by_name(zero2_fp32, tmp_path):
    from tessera.deepspeed_checkpoint import import_deepspeed
    spec, _ = zero2_fp32
    # Loading DeepSpeed's directory directly names the conversion.
    spec_direct = dict(spec, load_dir=spec["save_dir"], tessera_stage=2)
    spec_path = tmp_path / "direct.json"
    spec_path.write_text(json.dumps(spec_direct))
    r = subprocess.run([CLI, "launch", "--nproc-per-node", "1", "--master-port", str(free_port()), "--",
                        PROJECT_PYTHON, WORKER, "tessera", str(spec_path), str(tmp_path / "direct.out")],
                       env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "was written by DeepSpeed" in r.stderr and "import-deepspeed" in r.stderr
    # A rank's optimizer file missing.
    broken = tmp_path / "broken"
    shutil.copytree(spec["save_dir"], broken)
    os.remove(broken / "global_step6" / "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    with pytest.raises(ValueError, match=r"data-parallel ranks \[0\]; the run had 2 ranks"):
        import_deepspeed(str(broken), str(tmp_path / "out1"), verbose=False)
    # Tensor-parallel files.
    shutil.copy(broken / "global_step6" / "mp_rank_00_model_states.pt", broken / "global_step6" / "mp_rank_01_model_states.pt")
    with pytest.raises(ValueError, match="pipeline, tensor \\(model\\) or expert parallelism"):
        import_deepspeed(str(broken), str(tmp_path / "out2"), verbose=False)
    # Nothing was written by the failed imports.
    assert not os.path.exists(tmp_path / "out1" / "latest") and not os.path.exists(tmp_path / "out2" / "latest")
    with pytest.raises(ValueError, match="no such directory"):
        import_deepspeed(str(tmp_path / "nothing"), str(tmp_path / "out3"))
