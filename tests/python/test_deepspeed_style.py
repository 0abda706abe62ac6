"""DeepSpeed-style training scripts (tests/python/deepspeed_style_worker.py: training_data=, a
client AdamW with param groups and a Hugging Face-style scheduler, a client SGD with gradient
accumulation and a scheduler built by a callable, torch's Adam with L2 weight decay) run on tessera with only the import changed, on
1 and 2 ranks, and match the same loop in plain PyTorch on one process: every step's loss and
learning rate, and the final parameters."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT, check, child_env, launch

WORKER = "tests/python/deepspeed_style_worker.py"


def reference(tmp_path, script, dp):
    out = tmp_path / ("%s_ref_dp%d.json" % (script, dp))
    check(subprocess.run([sys.executable, WORKER, script, str(out), "--reference", "--dp", str(dp)],
                         env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=120))
    return json.loads(out.read_text())


@pytest.mark.parametrize("script,ranks", [(s, r) for s in ("cnn_data", "gpt_client", "sgd_gas") for r in (1, 2)] +
                         [("adam_l2", 1)])
def test_deepspeed_style_script_matches_plain_pytorch(tmp_path, script, ranks):
    out = tmp_path / (script + ".json")
    check(launch(ranks, [WORKER, script, str(out)]))
    ref = reference(tmp_path, script, ranks)
    for r in range(ranks):
        got = json.loads((out if r == 0 else tmp_path / ("%s.json.rank%d" % (script, r))).read_text())
        assert got["lrs"] == pytest.approx(ref["lrs"], rel=1e-12, abs=1e-15), (got["lrs"], ref["lrs"])
        assert got["losses"] == pytest.approx(ref["rank_losses"][r], rel=2e-5, abs=1e-6)
        for name, values in ref["params"].items():
            assert got["params"][name] == pytest.approx(values, rel=1e-4, abs=2e-5), name


def test_a_client_scheduler_resumes_from_a_checkpoint(tmp_path):
    """gpt_client saved half-way and loaded into a new engine with a new AdamW and scheduler: the
    scheduler's state and the groups' learning rates come back; the run equals the uninterrupted one."""
    out = tmp_path / "resumed.json"
    check(launch(2, [WORKER, "gpt_client", str(out), "--resume", str(tmp_path / "ckpt")]))
    ref = reference(tmp_path, "gpt_client", 2)
    got = json.loads(out.read_text())
    assert got["lrs"] == pytest.approx(ref["lrs"], rel=1e-12, abs=1e-15)
    assert got["losses"] == pytest.approx(ref["rank_losses"][0], rel=2e-5, abs=1e-6)
    for name, values in ref["params"].items():
        assert got["params"][name] == pytest.approx(values, rel=1e-4, abs=2e-5), name
