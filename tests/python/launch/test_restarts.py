"""`tessera launch --max-restarts N` and `--hang-timeout S` (engine/launch/restarts.h) with
checkpoint.auto_resume (engine/engine.h): a rank that dies, or hangs, stops the job; every rank
starts again and resumes from the latest checkpoint by itself; the job ends with the losses of an
uninterrupted run (exactly: the same arithmetic on the same ranks). The restart limit ends the job
with the last failure's status. tests/workers: restart_worker.py (TinyNet at ZeRO-2, a checkpoint
every step); the 2-host case is in test_cluster.py."""
import re
import time

from conftest import check, launch

WORKER = "tests/python/workers/restart_worker.py"
STEPS = 6


def losses(text):
    """{step: loss} from rank 0's "step N loss L" lines (a hostfile launch prefixes "HOST: [rank0]: "); a step
    trained twice must agree with itself."""
    out = {}
    for step, loss in re.findall(r"^(?:\S+: )*step (\d+) loss (\S+)$", text, re.M):
        assert out.setdefault(int(step), float(loss)) == float(loss), (step, out[int(step)], loss)
    return out


def run(tmp_path, name, *worker_flags, flags=(), expect_ok=True):
    save = tmp_path / name
    result = launch(2, [WORKER, str(save), str(STEPS)] + list(worker_flags), flags=flags)
    if expect_ok:
        check(result)
    return result


def test_a_killed_rank_restarts_every_rank_and_the_job_ends_as_an_uninterrupted_one(tmp_path):
    reference = losses(run(tmp_path, "reference").stdout)
    assert sorted(reference) == list(range(STEPS))
    r = run(tmp_path, "restarted", "--die-at", "3", flags=["--max-restarts", "1"])
    out = r.stdout + r.stderr
    assert "tessera launch: rank 1 (local rank 1) was killed by signal 9" in out, out[-3000:]
    assert "tessera launch: restart 1 of 1: every rank starts again (rank 1 (local rank 1) was killed" in out, out[-3000:]
    # The second attempt resumed from step 3's checkpoint (saved after step index 2) and says why it runs.
    assert "[tessera] restart 1: rank 1 (local rank 1) was killed by signal 9" in out, out[-3000:]
    assert re.search(r"checkpoint\.auto_resume: resumed from \S+global_step3 at step 3", out), out[-3000:]
    assert re.search(r"^step 4 \|.*\| restart 1", out, re.M), out[-3000:]  # the progress lines count it
    assert losses(r.stdout) == reference


def test_a_hung_rank_is_detected_by_its_heartbeat_and_the_job_restarts(tmp_path):
    reference = losses(run(tmp_path, "reference").stdout)
    start = time.monotonic()
    # SIGSTOP: the process is alive and silent. The collectives would wait 120 s for it; the
    # heartbeat (an optimizer step every few ms until then) goes stale in 2.
    r = run(tmp_path, "hung", "--hang-at", "3", flags=["--max-restarts", "1", "--hang-timeout", "2"])
    seconds = time.monotonic() - start
    out = r.stdout + r.stderr
    assert re.search(r"rank \d \(local rank \d\) made no progress for [\d.]+ s \(no optimizer step; "
                     r"hang_timeout_s 2\): hung", out), out[-3000:]
    assert "restart 1 of 1" in out, out[-3000:]
    assert losses(r.stdout) == reference
    assert seconds < 90, seconds  # not the collectives' 120 s timeout


def test_the_restart_limit_ends_the_job_with_the_last_failure(tmp_path):
    r = run(tmp_path, "always", "--die-at", "2", "--every-attempt", flags=["--max-restarts", "2"], expect_ok=False)
    out = r.stdout + r.stderr
    assert r.returncode == 137, (r.returncode, out[-3000:])
    # the first attempt and two restarts, each ended by the launcher's line
    assert out.count("tessera launch: rank 1 (local rank 1) was killed by signal 9") == 3, out[-3000:]
    assert "restart 2 of 2" in out and "restart 3" not in out, out[-3000:]
    assert "the restart limit (max_restarts 2) is reached: the job ends with status 137" in out, out[-3000:]


def test_auto_resume_without_a_checkpoint_is_an_error_unless_the_config_allows_a_fresh_start(tmp_path):
    r = run(tmp_path, "nothing_yet", "--no-fresh-start", expect_ok=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "checkpoint.auto_resume: no checkpoint to resume from in %s" % (tmp_path / "nothing_yet") in out, out[-3000:]
    assert "checkpoint.start_fresh_if_missing" in out, out[-3000:]
    fresh = run(tmp_path, "fresh")  # start_fresh_if_missing true: says so and trains from step 0
    assert "no checkpoint in %s yet: training starts from scratch" % (tmp_path / "fresh") in fresh.stdout
    assert sorted(losses(fresh.stdout)) == list(range(STEPS))
