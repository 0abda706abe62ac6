"""DeepSpeed-style training scripts (tests/python/workers/deepspeed_style_worker.py: training_data=, a
client AdamW with param groups and a Hugging Face-style scheduler, a client SGD with gradient
accumulation and a scheduler built by a callable — also with the script's own loss.backward() —,
torch's Adam with L2 weight decay, an argparse/init_distributed/torch.distributed script) run on
tessera with only the import changed, on 1 and 2 ranks, and match the same loop in plain PyTorch on one process: every step's loss and
learning rate, and the final parameters."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, check, child_env, launch, rank_interpreter

WORKER = "tests/python/workers/deepspeed_style_worker.py"


def reference(tmp_path, script, dp):
    out = tmp_path / ("%s_ref_dp%d.json" % (script, dp))
    check(subprocess.run(rank_interpreter() + [WORKER, script, str(out), "--reference", "--dp", str(dp)],
                         env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=120))
    return json.loads(out.read_text())


def compare_ranks(tmp_path, script, out, ranks):
    ref = reference(tmp_path, script.replace("_torch", ""), ranks)
    for r in range(ranks):
        got = json.loads((out if r == 0 else tmp_path / ("%s.json.rank%d" % (script, r))).read_text())
        assert got["lrs"] == pytest.approx(ref["lrs"], rel=1e-12, abs=1e-15), (got["lrs"], ref["lrs"])
        assert got["losses"] == pytest.approx(ref["rank_losses"][r], rel=2e-5, abs=1e-6)
        for name, values in ref["params"].items():
            assert got["params"][name] == pytest.approx(values, rel=1e-4, abs=2e-5), name
        if "mean_losses" in got:  # the script's own torch.distributed.all_reduce of its loss
            expected = [sum(ref["rank_losses"][q][i] for q in range(ranks)) / ranks for i in range(len(got["losses"]))]
            assert got["mean_losses"] == pytest.approx(expected, rel=2e-5, abs=1e-6)


@pytest.mark.parametrize("script,ranks", [(s, r) for s in ("cnn_data", "gpt_client", "sgd_gas") for r in (1, 2)] +
                         [("adam_l2", 1), ("sgd_gas_torch", 2)])
def test_deepspeed_style_script_matches_plain_pytorch(tmp_path, script, ranks):
    out = tmp_path / (script + ".json")
    check(launch(ranks, [WORKER, script, str(out)]))
    compare_ranks(tmp_path, script, out, ranks)


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_script_with_args_init_distributed_and_torch_distributed_calls(tmp_path, ranks):
    """dist_args: --local_rank from `tessera launch --pass-local-rank`, the config from
    args.deepspeed_config, init_distributed() first, DistributedSampler(dataset) with no arguments,
    torch.distributed.all_reduce and barrier: all on tessera's rendezvous."""
    from deepspeed_style_worker import setup

    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(setup("dist_args")[1]))
    out = tmp_path / "dist_args.json"
    check(launch(ranks, [WORKER, "dist_args", str(out), "--deepspeed", "--deepspeed_config", str(config)],
                 flags=["--pass-local-rank"]))
    compare_ranks(tmp_path, "dist_args", out, ranks)


def test_the_same_script_under_torchrun(tmp_path):
    """torchrun's agent hosts the store on MASTER_PORT: tessera's rendezvous and torch.distributed's
    default group (DistributedSampler(), all_reduce, barrier) both join it."""
    import os

    from conftest import ROOT, child_env, free_port
    from deepspeed_style_worker import setup

    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if not os.path.exists(torchrun):
        pytest.skip("torchrun not installed next to %s" % sys.executable)
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(setup("dist_args")[1]))
    out = tmp_path / "dist_args.json"
    check(subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), WORKER, "dist_args",
                          str(out), "--deepspeed", "--deepspeed_config", str(config)],
                         env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=240))
    compare_ranks(tmp_path, "dist_args", out, 2)


@pytest.mark.parametrize("script", ["gpt_client", "sgd_gas_torch"])
def test_a_client_scheduler_resumes_from_a_checkpoint(tmp_path, script):
    """Saved half-way and loaded into a new engine with a new optimizer and scheduler: the
    scheduler's state and the groups' learning rates come back; the run equals the uninterrupted one
    (sgd_gas_torch: gradient accumulation with the script's own loss.backward())."""
    out = tmp_path / "resumed.json"
    check(launch(2, [WORKER, script, str(out), "--resume", str(tmp_path / "ckpt")]))
    ref = reference(tmp_path, script.replace("_torch", ""), 2)
    got = json.loads(out.read_text())
    assert got["lrs"] == pytest.approx(ref["lrs"], rel=1e-12, abs=1e-15)
    assert got["losses"] == pytest.approx(ref["rank_losses"][0], rel=2e-5, abs=1e-6)
    for name, values in ref["params"].items():
        assert got["params"][name] == pytest.approx(values, rel=1e-4, abs=2e-5), name
