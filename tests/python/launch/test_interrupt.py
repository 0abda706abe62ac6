"""Ctrl-C: `tessera launch` forwards SIGINT to every rank; each rank's Python raises
KeyboardInterrupt as soon as the engine call it is in returns (backward/step release the GIL and
return within a step), so the job ends with status 130 well within the launcher's grace period (5 s,
after which it would SIGKILL). A rank waiting in the rendezvous (C++, minutes) has SIGINT's default
action for that wait and ends at once."""
import os
import signal
import subprocess
import sys
import time

from conftest import CLI, ROOT, WORKERS, child_env, free_port

GRACE_S = 5


def start(mode):
    cmd = [CLI, "launch", "--nproc-per-node", "2", "--master-port", str(free_port()), "--grace-period", str(GRACE_S),
           "--tag-output", "--", sys.executable, "tests/python/workers/interrupt_worker.py", mode]  # whole lines, [rankN]: 
    # SIGINT back to its default for the launcher: pytest may run with it ignored (a background job).
    return subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for(proc, needle, count):
    seen, lines = 0, []
    deadline = time.time() + 120
    for line in proc.stdout:
        lines.append(line)
        if needle in line:
            seen += 1
            if seen == count:
                return lines
        assert time.time() < deadline, "".join(lines)
    raise AssertionError("the job ended before printing %r %d times:\n%s" % (needle, count, "".join(lines)))


def interrupt(proc):
    start_s = time.time()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    return out, time.time() - start_s


def test_ctrl_c_while_training_stops_every_rank():
    proc = start("train")
    wait_for(proc, "ready rank", 2)
    time.sleep(0.5)
    out, seconds = interrupt(proc)
    assert proc.returncode == 130, out
    lines = out.splitlines()
    # Both ranks raised it: in Python code, or when the engine call returned (a rank whose collective
    # failed because the other had already exited gets KeyboardInterrupt too, not CommError).
    assert "[rank0]: KeyboardInterrupt" in lines and "[rank1]: KeyboardInterrupt" in lines, out
    assert "CommError" not in out, out
    assert "interrupted by signal 2" in out and "killed after" not in out, out  # no SIGKILL needed
    assert seconds < GRACE_S, out


def test_ctrl_c_during_the_rendezvous_stops_at_once():
    proc = start("late")
    wait_for(proc, "rank 1 sleeping", 1)
    time.sleep(1.0)  # rank 0 is now waiting for rank 1 in the rendezvous
    out, seconds = interrupt(proc)
    assert proc.returncode == 130, out
    assert "killed after" not in out and seconds < GRACE_S, out


def test_a_dead_peer_gives_a_comm_error_without_cpp_backtrace():
    # Started directly, not through the launcher (which would stop the survivor itself).
    env = child_env(WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), TESSERA_TIMEOUT_S="30",
                    OMP_NUM_THREADS="1")
    ranks = [subprocess.Popen([sys.executable, os.path.join(WORKERS, "interrupt_worker.py"), "die"],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    out0 = ranks[0].communicate(timeout=120)[0]
    ranks[1].communicate(timeout=120)
    assert ranks[1].returncode == 3
    assert ranks[0].returncode == 1, out0
    assert "error type CommError" in out0, out0
    assert "group 'data'" in out0 or "group 'world'" in out0, out0
    # torch's C++ backtrace ("frame #3: ...", "Exception raised from ...") stays out of the message.
    assert "frame #" not in out0, out0
    assert "Exception raised from" not in out0, out0
