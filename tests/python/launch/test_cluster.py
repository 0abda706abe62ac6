"""Multi-node jobs on an emulated cluster (scripts/cluster.sh): 2 hosts, each a network namespace
with its own address on a bridge, so rendezvous and Gloo's connections cross real interfaces
between hosts. Two ways to start a job there: each host runs `tessera launch --nnodes 2 --node-rank
K` (what a user runs on each machine, or what a scheduler runs there), or one `tessera launch
--hostfile` here starts every host's share over ssh or pdsh, through the sshd each host runs.

The tests on the emulated hosts are skipped, with the reason, where this machine cannot make
network namespaces (no root / no CAP_NET_ADMIN). What a job exposes on the network (its listening
sockets) is checked on this machine's own interfaces too.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from conftest import CLI, CLUSTER, ROOT, child_env, emulated_hosts, free_port, launch
from parity_cases import GPT, GPT_PARAM_TOL, case, compare, write_cases

MASTER = "10.213.0.1"


@pytest.fixture(scope="module")
def cluster():
    with emulated_hosts(2) as hosts:
        yield ["10.213.0.%d" % k for k in hosts]


def skip_without_pdsh(launcher):
    if launcher == "pdsh" and subprocess.run(["sh", "-c", "command -v pdsh"], capture_output=True).returncode != 0:
        pytest.skip("pdsh is not installed (scripts/setup.sh installs it)")


@pytest.fixture(scope="module")
def ssh_config(cluster):
    """The ssh client config that reaches the hosts' sshd (made by `scripts/cluster.sh up`)."""
    if not os.path.exists("/usr/sbin/sshd"):
        pytest.skip("no sshd on the emulated hosts: openssh-server is not installed (scripts/setup.sh installs it)")
    return subprocess.run([CLUSTER, "ssh-config"], check=True, capture_output=True, text=True).stdout.strip()


# Every rank meets the others, says it is up, and stays up a few seconds for the test to look at
# its sockets.
LISTENING = """
import os, sys, time, torch, tessera
tessera.init_distributed()
torch.distributed.barrier()
print("up", os.getpid(), flush=True)
time.sleep(4)
torch.distributed.barrier()
"""


def listening_sockets(pids):
    """(address, port) of every TCP socket the processes `pids` listen on (`ss -ltnp`)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        if any("pid=%s," % pid in line for pid in pids):
            local = line.split()[3]
            found.append(tuple(local.rsplit(":", 1)))
    return found


def ranks_up(proc, n):
    pids = []
    for line in proc.stdout:
        if line.startswith("[rank") and "]: up " in line:  # --tag-output: whole lines, one rank each
            pids.append(line.split("]: up ", 1)[1].split()[0])
            if len(pids) == n:
                return pids
    raise AssertionError("the job ended before %d ranks were up" % n)


@pytest.mark.skipif(subprocess.run(["sh", "-c", "command -v ss"], capture_output=True).returncode != 0,
                    reason="ss (iproute2) is not installed")
def test_a_job_listens_only_on_the_address_it_was_given():
    """Rank 0's rendezvous store (LibTorch's TCPStore would listen on every interface) and every
    other socket of the ranks listen on the master address's interface, not on 0.0.0.0 or [::]."""
    port = free_port()
    proc = subprocess.Popen([CLI, "launch", "--tag-output", "--nproc-per-node", "2", "--master-port", str(port),
                             "--timeout", "60", "--", sys.executable, "-c", LISTENING],
                            env=child_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pids = ranks_up(proc, 2)
        sockets = listening_sockets(pids)
    finally:
        rest = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, rest
    assert ("127.0.0.1", str(port)) in sockets, sockets  # the store, on the master address
    exposed = [s for s in sockets if s[0] in ("*", "0.0.0.0", "[::]", "[::ffff:0.0.0.0]")]
    assert exposed == [], "listening on every interface: %s" % exposed


def start_node(host, node_rank, port, argv, timeout_s=60, master=MASTER):
    """`tessera launch` for node `node_rank` of 2 (2 ranks each) on emulated host `host` (1-based)."""
    cmd = [CLUSTER, "exec", str(host), CLI, "launch", "--nnodes", "2", "--node-rank", str(node_rank),
           "--nproc-per-node", "2", "--master-addr", master, "--master-port", str(port),
           "--timeout", str(timeout_s), "--", sys.executable] + list(argv)
    return subprocess.Popen(cmd, env=child_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(procs, timeout=240):
    return [p.communicate(timeout=timeout)[0] for p in procs]


def namespace_pids():
    """Every process on the emulated hosts but their sshd listeners."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    pids = []
    for ns in (line.split()[0] for line in out.splitlines() if line.startswith("tessera-h")):
        pids += subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    state = os.environ.get("TESSERA_CLUSTER_STATE", "/tmp/tessera-cluster")
    listeners = set()
    for name in (os.listdir(state) if os.path.isdir(state) else []):
        if name.startswith("sshd.") and name.endswith(".pid"):
            listeners.add(open(os.path.join(state, name)).read().strip())
    return [p for p in pids if p not in listeners]


def left_on_hosts(ignore=(), seconds=10.0):
    """The processes still on the emulated hosts once they had `seconds` to go (a finished launch's
    ssh sessions and the daemons' step helpers wind down on their own time, asynchronously), as
    "pid command"; those whose command is in `ignore` do not count."""
    deadline = time.monotonic() + seconds
    while True:
        left = [p for p in namespace_pids() if _command(p) not in ignore]
        if not left or time.monotonic() > deadline:
            return ["%s %s" % (p, _command(p)) for p in left]
        time.sleep(0.2)


def test_two_hosts_by_two_ranks_match_torch(cluster, tmp_path):
    """ZeRO-2 on 4 ranks over 2 hosts trains as plain PyTorch on one process (test_parity's tolerances)."""
    c = case(2, dp=4, seed=13)
    out = tmp_path / "two_hosts.pt"
    argv = ["tests/python/workers/parity_worker.py", write_cases(tmp_path, [c]), str(out)]
    port = free_port()
    procs = [start_node(host, host - 1, port, argv) for host in (1, 2)]
    outputs = finish(procs)
    for host, (p, text) in enumerate(zip(procs, outputs), 1):
        assert p.returncode == 0, "host %d:\n%s" % (host, text[-4000:])
    compare(torch.load(out)[0], c)


# Every rank joins the world's all-reduce in a loop; rank 3 (on host 2) dies after the first one.
DYING = """
import os, sys, time, torch, tessera
tessera.init_distributed()
t = torch.ones(1)
torch.distributed.all_reduce(t)
print("rank %s reduced %s" % (os.environ["RANK"], t.item()), flush=True)  # one write: ranks share the stream
if os.environ["RANK"] == "3":
    time.sleep(1)  # every rank's line relayed to the launcher first: stopping the hosts drops what is in flight
    os._exit(7)
for _ in range(6000):
    torch.distributed.all_reduce(t)
    time.sleep(0.01)
"""


def test_a_rank_dying_on_host_2_stops_every_rank_on_both_hosts(cluster, tmp_path):
    port = free_port()
    start = time.monotonic()
    procs = [start_node(host, host - 1, port, ["-c", DYING], timeout_s=30) for host in (1, 2)]
    outputs = finish(procs, timeout=120)
    seconds = time.monotonic() - start
    assert all("reduced 4.0" in text for text in outputs), outputs
    assert procs[1].returncode == 7 and "rank 3 (local rank 1) exited with status 7" in outputs[1], outputs[1][-3000:]
    assert procs[0].returncode != 0, outputs[0][-3000:]  # host 1's ranks lost their peers and stopped
    assert seconds < 60, seconds  # not the 60 s of the loop, nor a hang
    time.sleep(0.5)
    assert left_on_hosts() == [], "orphans left on the hosts"


def test_a_master_address_nobody_answers_fails_naming_it(cluster):
    """Node 1 alone, told to meet at an address no host has: a rendezvous error that names it."""
    proc = start_node(2, 1, free_port(), ["-c", "import tessera; tessera.init_distributed()"], timeout_s=5,
                      master="10.213.0.99")
    out = finish([proc], timeout=120)[0]
    assert proc.returncode != 0
    assert "10.213.0.99" in out, out[-3000:]


# ---- one command for every host: tessera launch --hostfile (ssh, pdsh) ----


def write_hostfile(tmp_path, lines):
    path = tmp_path / "hostfile"
    path.write_text("# the emulated hosts\n" + "".join(line + "\n" for line in lines))
    return str(path)


def launch_on_hosts(ssh_config, hostfile, argv, launcher="ssh", timeout_s=60, flags=(), program=sys.executable):
    """`tessera launch --hostfile` from this machine (outside the hosts), reaching them with the
    cluster's ssh config: `program argv...` on every rank (a Python script by default).
    GLOO_SOCKET_IFNAME goes to every host with the forwarded variables."""
    config = {"hosts": {"ssh_args": ["-F", ssh_config], "connect_timeout_s": 5}}
    cmd = [CLI, "launch", "--hostfile", hostfile, "--launcher", launcher, "--master-port", str(free_port()),
           "--timeout", str(timeout_s), "--config", json.dumps(config)] + list(flags) + ["--", program] + list(argv)
    return subprocess.Popen(cmd, env=child_env(GLOO_SOCKET_IFNAME="eth0"), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_hostfile_launch_over_ssh_trains_two_hosts_by_two_ranks_as_torch(cluster, ssh_config, tmp_path):
    """One command starts both hosts' ranks over ssh; the example GPT (tied head) at ZeRO-2 on the 4
    ranks trains as plain PyTorch on one process (test_parity's GPT tolerances)."""
    c = case(2, dp=4, seed=17, **GPT)
    out = tmp_path / "hostfile_ssh.pt"
    hostfile = write_hostfile(tmp_path, ["10.213.0.1 slots=2", "10.213.0.2 slots=2"])
    argv = ["tests/python/workers/parity_worker.py", write_cases(tmp_path, [c]), str(out)]
    proc = launch_on_hosts(ssh_config, hostfile, argv)
    text = finish([proc])[0]
    assert proc.returncode == 0, text[-4000:]
    compare(torch.load(out)[0], c, param_tol=GPT_PARAM_TOL)
    assert left_on_hosts() == [], "processes left on the hosts"


HOSTS_REPORT = """
import os, socket, subprocess
addr = subprocess.run(["ip", "-o", "-4", "addr", "show", "eth0"], capture_output=True, text=True).stdout.split()[3]
print("rank %s of %s on %s, master %s, local %s, cuda %s, extra %s" % (os.environ["RANK"], os.environ["WORLD_SIZE"],
      addr, os.environ["MASTER_ADDR"], os.environ["LOCAL_RANK"], os.environ.get("CUDA_VISIBLE_DEVICES"),
      os.environ.get("FROM_ENV_FILE")), flush=True)
"""


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_hostfile_launch_places_ranks_by_include_and_forwards_the_env_file(cluster, ssh_config, tmp_path, launcher):
    """--include picks hosts and slots (the slots become CUDA_VISIBLE_DEVICES), the env file's
    variables reach every rank, and the output is "HOST: [rankN]: line" with ssh and with pdsh."""
    skip_without_pdsh(launcher)
    hostfile = write_hostfile(tmp_path, ["10.213.0.1 slots=4", "10.213.0.2 slots=4"])
    env_file = tmp_path / "env"
    env_file.write_text("FROM_ENV_FILE=100%% sure, it's here\n")
    proc = launch_on_hosts(ssh_config, hostfile, ["-c", HOSTS_REPORT], launcher=launcher,
                           flags=["--include", "10.213.0.2:1,3@10.213.0.1:0,2", "--env-file", str(env_file)])
    text = finish([proc])[0]
    assert proc.returncode == 0, text[-4000:]
    for rank, host, local, cuda in [(0, 1, 0, "0,2"), (1, 1, 1, "0,2"), (2, 2, 0, "1,3"), (3, 2, 1, "1,3")]:
        line = "10.213.0.%d: [rank%d]: rank %d of 4 on 10.213.0.%d/24, master 10.213.0.1, local %d, cuda %s, " \
               "extra 100%%%% sure, it's here" % (host, rank, rank, host, local, cuda)
        assert line in text, text[-4000:]
    assert left_on_hosts() == [], "processes left on the hosts"


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_hostfile_launch_a_rank_dying_on_host_2_stops_every_rank_on_both_hosts(cluster, ssh_config, tmp_path, launcher):
    skip_without_pdsh(launcher)
    hostfile = write_hostfile(tmp_path, ["10.213.0.1 slots=2", "10.213.0.2 slots=2"])
    start = time.monotonic()
    proc = launch_on_hosts(ssh_config, hostfile, ["-c", DYING], launcher=launcher, timeout_s=30)
    text = finish([proc], timeout=120)[0]
    seconds = time.monotonic() - start
    assert text.count("reduced 4.0") == 4, text[-4000:]
    assert proc.returncode == 7, text[-4000:]
    # host 2's launcher names the rank, and its line names the host
    assert "10.213.0.2: tessera launch: rank 3 (local rank 1) exited with status 7" in text, text[-4000:]
    last = text.strip().splitlines()[-1]
    if launcher == "ssh":
        assert last.startswith("tessera launch: host 10.213.0.2 (node 1) exited with status 7"), text[-4000:]
    else:
        assert last.startswith("tessera launch: pdsh reported that host 10.213.0.2 exited with status 7"), text[-4000:]
    assert seconds < 40, seconds  # host 1 is stopped at once, not when its collectives time out (30 s)
    time.sleep(0.5)
    assert left_on_hosts() == [], "orphans left on the hosts"


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_hostfile_launch_with_max_restarts_restarts_both_hosts_and_resumes_from_the_checkpoint(cluster, ssh_config,
                                                                                               tmp_path, launcher):
    """A rank on host 2 killed at step 3 of a 2 hosts x 2 ranks ZeRO-2 job (restart_worker.py: a
    checkpoint every step, checkpoint.auto_resume) with --max-restarts 1: both hosts' launchers start
    again (over ssh, or pdsh), the job resumes from step 3's checkpoint and ends with the losses of
    an uninterrupted 4-rank run (here, on loopback), exactly."""
    skip_without_pdsh(launcher)
    from test_restarts import STEPS, WORKER, losses
    reference = launch(4, [WORKER, str(tmp_path / "reference"), str(STEPS)])
    assert reference.returncode == 0, reference.stderr[-3000:]
    hostfile = write_hostfile(tmp_path, ["10.213.0.1 slots=2", "10.213.0.2 slots=2"])
    proc = launch_on_hosts(ssh_config, hostfile, [WORKER, str(tmp_path / "restarted"), str(STEPS), "--die-at", "3",
                                                  "--rank", "3"], launcher=launcher, flags=["--max-restarts", "1"])
    text = finish([proc], timeout=240)[0]
    assert proc.returncode == 0, text[-4000:]
    assert "10.213.0.2: tessera launch: rank 3 (local rank 1) was killed by signal 9" in text, text[-4000:]
    why = {"ssh": "host 10.213.0.2 (node 1)", "pdsh": "pdsh reported that host 10.213.0.2 exited with status 137"}
    assert "tessera launch: restart 1 of 1: every rank starts again (%s" % why[launcher] in text, text[-4000:]
    assert re.search(r"resumed from \S+global_step3 at step 3", text), text[-4000:]
    assert losses(text) == losses(reference.stdout)
    time.sleep(0.5)
    assert left_on_hosts() == [], "orphans left on the hosts"


def test_elastic_launch_drops_a_host_that_went_away_and_goes_on_at_the_elastic_batch_layout(cluster, ssh_config,
                                                                                          tmp_path):
    """--nnodes 1:2 --max-restarts 1 and DeepSpeed's elasticity (a global batch of 8): host 2 stops
    answering ssh and a rank on it dies at step 3; the restart drops host 2 and goes on with host
    1's 2 ranks at micro-batch 2 x 2 accumulation steps, from step 3's checkpoint (saved on 4 ranks,
    resharded to 2). From there the losses are those of a 2-rank run from that checkpoint."""
    import shutil
    from test_restarts import STEPS, WORKER, losses
    save, go = tmp_path / "elastic", tmp_path / "go"
    hostfile = write_hostfile(tmp_path, ["10.213.0.1 slots=2", "10.213.0.2 slots=2"])
    proc = launch_on_hosts(ssh_config, hostfile, [WORKER, str(save), str(STEPS), "--elastic", "--die-at", "3",
                                                  "--rank", "3", "--wait-for", str(go)],
                           flags=["--max-restarts", "1", "--nnodes", "1:2"])
    try:
        lines = []
        for line in proc.stdout:  # every rank is up (rank 0 printed its layout): host 2 goes away
            lines.append(line)
            if "layout: batch 8 = micro 2 x steps 1 x ranks 4 (elastic)" in line:
                break
        subprocess.run([CLUSTER, "sshd", "2", "stop"], check=True, capture_output=True, text=True, timeout=30)
        go.write_text("")
        text = "".join(lines) + proc.communicate(timeout=240)[0]
    finally:
        proc.kill()
        subprocess.run([CLUSTER, "sshd", "2", "start"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, text[-4000:]
    assert re.search(r"tessera launch: dropping 10\.213\.0\.2 \(ssh exited with status 255[^)]*\); the job goes on "
                     r"with 1 host\(s\)", text), text[-4000:]
    assert "layout: batch 8 = micro 2 x steps 2 x ranks 2 (elastic)" in text, text[-4000:]
    assert re.search(r"resumed from \S+global_step3 at step 3", text), text[-4000:]
    got = losses(text)
    assert sorted(got) == list(range(STEPS)), got
    # The reference: 2 ranks here from a copy of the same step-3 checkpoint.
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    shutil.copytree(save / "global_step3", reference_dir / "global_step3")
    (reference_dir / "latest").write_text("global_step3")
    reference = launch(2, [WORKER, str(reference_dir), str(STEPS), "--elastic"])
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = losses(reference.stdout)
    assert sorted(expected) == [3, 4, 5], expected
    for step in (3, 4, 5):
        assert abs(got[step] - expected[step]) <= 1e-9 * abs(expected[step]), (step, got[step], expected[step])
    time.sleep(0.5)
    assert left_on_hosts() == [], "orphans left on the hosts"


def test_hostfile_launch_a_host_that_cannot_be_reached_fails_before_anything_starts(cluster, ssh_config, tmp_path):
    hostfile = write_hostfile(tmp_path, ["10.213.0.1 slots=1", "10.213.0.77 slots=1"])
    marker = tmp_path / "started"
    start = time.monotonic()
    proc = launch_on_hosts(ssh_config, hostfile, ["-c", "open(%r, 'a').write('x')" % str(marker)])
    text = finish([proc], timeout=60)[0]
    assert proc.returncode != 0
    assert "cannot reach every host with ssh" in text and "10.213.0.77: ssh exited with status 255" in text, text
    assert "10.213.0.1:" not in text  # the reachable host is not reported, and nothing ran on it
    assert not marker.exists()
    assert time.monotonic() - start < 20  # the 5 s connect timeout, not a hang


# ---- under SLURM: slurmctld and a slurmd on the emulated hosts (scripts/cluster.sh slurm) ----


@pytest.fixture(scope="module")
def slurm_conf(cluster):
    missing = [t for t in ("munged", "slurmctld", "slurmd", "srun", "salloc")
               if subprocess.run(["sh", "-c", "command -v " + t], capture_output=True).returncode != 0]
    if missing:
        pytest.skip("SLURM is not installed (%s missing; scripts/setup.sh installs munge, slurmctld, slurmd, "
                    "slurm-client)" % ", ".join(missing))
    subprocess.run([CLUSTER, "slurm"], check=True, capture_output=True, text=True, timeout=120)
    return subprocess.run([CLUSTER, "slurm-conf"], check=True, capture_output=True, text=True).stdout.strip()


def in_allocation(slurm_conf, argv, **env):
    """`salloc -N 2 argv...` on the emulated SLURM cluster. The nodes are h1, h2, names nothing
    resolves here, so the master is given by address."""
    return subprocess.Popen(["salloc", "-N", "2"] + list(argv),
                            env=child_env(SLURM_CONF=slurm_conf, GLOO_SOCKET_IFNAME="eth0", **env), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_launcher_slurm_runs_a_node_launcher_per_node_through_srun(cluster, slurm_conf, tmp_path):
    """`tessera launch --launcher slurm` inside an allocation: one node launcher per node (srun),
    2 ranks each; ZeRO-2 on the 4 ranks trains as plain PyTorch."""
    c = case(2, dp=4, seed=19)
    out = tmp_path / "slurm_launcher.pt"
    argv = [CLI, "launch", "--launcher", "slurm", "--nproc-per-node", "2", "--master-addr", MASTER,
            "--master-port", str(free_port()), "--timeout", "60", "--", sys.executable,
            "tests/python/workers/parity_worker.py", write_cases(tmp_path, [c]), str(out)]
    proc = in_allocation(slurm_conf, argv)
    text = finish([proc])[0]
    assert proc.returncode == 0, text[-4000:]
    compare(torch.load(out)[0], c)


def test_srun_alone_starts_ranks_that_find_their_place_from_slurms_variables(cluster, slurm_conf, tmp_path):
    """No tessera launch: srun starts the 4 ranks (2 per node) and each reads SLURM_PROCID,
    SLURM_NTASKS, SLURM_LOCALID; the copy-paste srun line of docs/launcher.md, for real."""
    c = case(2, dp=4, seed=23)
    out = tmp_path / "srun_alone.pt"
    argv = ["srun", "--ntasks-per-node", "2", sys.executable, "tests/python/workers/parity_worker.py",
            write_cases(tmp_path, [c]), str(out)]
    proc = in_allocation(slurm_conf, argv, MASTER_ADDR=MASTER, MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    text = finish([proc])[0]
    assert proc.returncode == 0, text[-4000:]
    compare(torch.load(out)[0], c)


def test_launcher_slurm_a_rank_dying_on_node_2_stops_the_job_with_its_status(cluster, slurm_conf):
    start = time.monotonic()
    argv = [CLI, "launch", "--launcher", "slurm", "--nproc-per-node", "2", "--master-addr", MASTER,
            "--master-port", str(free_port()), "--timeout", "30", "--", sys.executable, "-c", DYING]
    proc = in_allocation(slurm_conf, argv)
    text = finish([proc], timeout=120)[0]
    assert text.count("reduced 4.0") == 4, text[-4000:]
    assert proc.returncode == 7, text[-4000:]  # the failing rank's, not srun's largest (143)
    assert "1: tessera launch: rank 3 (local rank 1) exited with status 7" in text, text[-4000:]
    assert "tessera launch: srun reported that node h2 (node 1) exited with status 7" in text, text[-4000:]
    assert time.monotonic() - start < 40
    # slurmd winds a finished step down on its own time: what is left must go within seconds.
    assert left_on_hosts(ignore=("", "slurmd", "slurmctld", "slurmscriptd")) == [], "orphans left on the nodes"


def _command(pid):
    try:
        return open("/proc/%s/comm" % pid).read().strip()
    except OSError:
        return ""


def test_launcher_slurm_with_max_restarts_starts_every_node_again_and_resumes_from_the_checkpoint(cluster, slurm_conf,
                                                                                                 tmp_path):
    """--launcher slurm --max-restarts 1 inside a 2-node allocation: rank 3 (node h2) killed at step
    3 of the ZeRO-2 job; the launcher runs a new srun step on both nodes, which resumes from step
    3's checkpoint and ends with the losses of an uninterrupted 4-rank run, exactly."""
    from test_restarts import STEPS, WORKER, losses
    reference = launch(4, [WORKER, str(tmp_path / "reference"), str(STEPS)])
    assert reference.returncode == 0, reference.stderr[-3000:]
    argv = [CLI, "launch", "--launcher", "slurm", "--nproc-per-node", "2", "--master-addr", MASTER,
            "--master-port", str(free_port()), "--timeout", "60", "--max-restarts", "1", "--", sys.executable,
            WORKER, str(tmp_path / "restarted"), str(STEPS), "--die-at", "3", "--rank", "3"]
    proc = in_allocation(slurm_conf, argv)
    text = finish([proc], timeout=240)[0]
    assert proc.returncode == 0, text[-4000:]
    assert "1: tessera launch: rank 3 (local rank 1) was killed by signal 9" in text, text[-4000:]
    assert "tessera launch: restart 1 of 1: every rank starts again" in text, text[-4000:]
    assert re.search(r"resumed from \S+global_step3 at step 3", text), text[-4000:]
    assert losses(text) == losses(reference.stdout)


def test_probe_link_measures_the_shaped_link_between_two_hosts_and_the_planner_takes_it(cluster, ssh_config, tmp_path):
    """`tessera launch --hostfile` with a rank on each host runs `tessera probe-link`: with the hosts'
    links shaped to 1 Gbit/s (0.125 GB/s) it measures about that; rank 0 writes it to the calibration
    cache, and `tessera plan` then takes it as the rate between nodes and says where it came from."""
    shape = ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", "1gbit", "burst", "1mb", "latency", "50ms"]
    cache = tmp_path / "cache"
    hostfile = write_hostfile(tmp_path, ["10.213.0.1 slots=1", "10.213.0.2 slots=1"])
    try:
        for k in (1, 2):
            subprocess.run([CLUSTER, "exec", str(k)] + shape, check=True, capture_output=True, text=True, timeout=30)
        probe = launch_on_hosts(ssh_config, hostfile, ["probe-link", "--cache", str(cache / "calibration.json")],
                                program=CLI)
        text = finish([probe], timeout=180)[0]
    finally:
        for k in (1, 2):
            subprocess.run([CLUSTER, "exec", str(k), "tc", "qdisc", "del", "dev", "eth0", "root"], capture_output=True,
                           timeout=30)
    assert probe.returncode == 0, text[-4000:]
    m = re.search(r"tessera probe-link: 2 ranks on 2 hosts: reduce-scatter \+ all-gather ([0-9.]+) GB/s", text)
    assert m, text[-4000:]
    measured = float(m.group(1))
    assert 0.08 <= measured <= 0.13, text[-4000:]
    entry = json.load(open(cache / "calibration.json"))["inter_node"]
    assert entry["bus_gbps"] == pytest.approx(measured, rel=1e-2)  # printed to 3 decimals
    plan = subprocess.run([CLI, "plan", "--device", "cpu", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab",
                           "256", "--seq-len", "32", "--global-batch", "8", "--nodes", "2", "--gpus-per-node", "1",
                           "--cores-per-node", "1"], env=child_env(TESSERA_CACHE_DIR=str(cache)), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    line = re.search(r"links between nodes: ([0-9.]+) GB/s \(cached \((.*)", plan.stdout)
    assert line, plan.stdout[-3000:]
    assert float(line.group(1)) == pytest.approx(entry["bus_gbps"], rel=1e-3)
    assert str(cache) in line.group(2) and "tessera probe-link" in line.group(2), line.group(0)
