"""tessera.collaborative (python/tessera/collaborative.py): peers, each a tessera job, averaging
their parameters through Hivemind's DHT and averager (hivemind from PyPI, in its own venv that
reuses this one's torch and tessera: bench/setup_hivemind.sh). Each peer is a process started by
`tessera launch` (its own rendezvous), the peers on this machine's loopback or each on its own
emulated host (scripts/cluster.sh) behind a 100 Mbit/s link."""
import json
import subprocess
import time

import pytest
import torch

from conftest import CLI, CLUSTER, ROOT, child_env, emulated_hosts, free_port, peer_python

WORKER = "tests/python/workers/collaborative_worker.py"
# Alone, after the parallel pass: the peers' matchmaking waits on each other in seconds.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def hivemind_python():
    return peer_python("TESSERA_HIVEMIND_PYTHON", "setup_hivemind.sh")


def start_peer(python, tmp_path, name, spec, nproc=1, host=None):
    """A peer's `tessera launch` job, on this machine or (host K) inside emulated host K."""
    path = tmp_path / (name + ".spec.json")
    path.write_text(json.dumps(dict(spec, host="10.213.0.%d" % host) if host else spec))
    cmd = [CLI, "launch", "--nproc-per-node", str(nproc), "--master-port", str(free_port()), "--timeout", "120",
           "--", python, WORKER, str(path), str(tmp_path / (name + ".out.json"))]
    if host:
        cmd = [CLUSTER, "exec", str(host)] + cmd
    return subprocess.Popen(cmd, env=child_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finish(procs, timeout=240):
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-4000:]
    return outputs


def run_peers(python, tmp_path, specs, nprocs=None):
    """Peer 0 first (it starts the DHT and writes its addresses), then the others joining it."""
    maddrs = str(tmp_path / "maddrs.json")
    procs = []
    for i, spec in enumerate(specs):
        spec = dict(spec, peer=i, **({"maddrs_out": maddrs} if i == 0 else {"maddrs_in": maddrs}))
        procs.append(start_peer(python, tmp_path, "peer%d" % i, spec, (nprocs or [1] * len(specs))[i]))
    finish(procs)
    return [json.load(open(tmp_path / ("peer%d.out.json" % i))) for i in range(len(specs))]


def test_a_round_averages_the_peers_parameters_weighted_by_their_samples(hivemind_python, tmp_path):
    """3 peers train 2, 3 and 5 local steps of 4 samples (weights 8, 12, 20; the target 40 is
    reached when the last one reports), then average once, all 3 in the group: every peer ends with
    sum_p w_p theta_p / sum_p w_p of the parameters each had just before the round."""
    specs = [dict(run_id="weighted", steps=n, samples=4, target=40, min_group=3, wait_rounds=1) for n in (2, 3, 5)]
    results = run_peers(hivemind_python, tmp_path, specs)
    rounds = [r["rounds"] for r in results]
    assert all(len(r) == 1 for r in rounds), rounds
    for r in rounds:
        assert r[0]["ok"] and r[0]["group"] == 3, r[0]
    weights = [r[0]["weight"] for r in rounds]
    assert weights == [8, 12, 20], weights
    before = [torch.tensor(r[0]["before"]) for r in rounds]
    assert not torch.allclose(before[0], before[2])  # they trained apart: the average means something
    expected = sum(w * b for w, b in zip(weights, before)) / sum(weights)
    for r in rounds:
        after = torch.tensor(r[0]["after"])
        assert torch.allclose(after, expected, rtol=1e-5, atol=1e-6), (after - expected).abs().max()


def test_diloco_applies_the_outer_nesterov_step_to_the_averaged_change(hivemind_python, tmp_path):
    """outer_lr 0.7 (momentum 0.9): the peers average their change since the anchor (the common
    initial parameters), delta_p = anchor - theta_p weighted by samples, and each takes the outer
    Nesterov step from the anchor: theta = anchor - 0.7 (mean + 0.9 m), m = mean on the first round."""
    specs = [dict(run_id="diloco", steps=n, samples=4, target=20, min_group=2, wait_rounds=1, outer_lr=0.7)
             for n in (2, 3)]
    results = run_peers(hivemind_python, tmp_path, specs)
    anchor = torch.tensor(results[0]["joined"])
    assert torch.equal(anchor, torch.tensor(results[1]["joined"]))  # the same seed: one anchor
    rounds = [r["rounds"][0] for r in results]
    assert all(r["ok"] and r["group"] == 2 for r in rounds), rounds
    weights = [r["weight"] for r in rounds]
    assert weights == [8, 12]
    mean = sum(w * (anchor - torch.tensor(r["before"])) for w, r in zip(weights, rounds)) / sum(weights)
    expected = anchor - 0.7 * (mean + 0.9 * mean)
    for r in rounds:
        assert torch.allclose(torch.tensor(r["after"]), expected, rtol=1e-5, atol=1e-6)


def test_a_peer_of_two_ranks_with_zero_2_averages_with_a_peer_of_one(hivemind_python, tmp_path):
    """Peer 0 is 2 ranks at ZeRO-2 (its rank 0 talks to the other peers, and the result reaches its
    rank 1 and both ranks' fp32 master shards), peer 1 one rank; weights 2 x 4 x 2 and 4 x 3, with
    fp16 on the wire: the weighted mean within fp16's precision, the same on every rank."""
    specs = [dict(run_id="ranks", steps=2, samples=4, target=28, min_group=2, wait_rounds=1, stage=2,
                  compression="fp16"),
             dict(run_id="ranks", steps=3, samples=4, target=28, min_group=2, wait_rounds=1, compression="fp16")]
    results = run_peers(hivemind_python, tmp_path, specs, nprocs=[2, 1])
    rounds = [r["rounds"][0] for r in results]
    assert [r["weight"] for r in rounds] == [16, 12] and all(r["ok"] for r in rounds), rounds
    expected = (16 * torch.tensor(rounds[0]["before"]) + 12 * torch.tensor(rounds[1]["before"])) / 28
    for r in rounds:
        assert torch.allclose(torch.tensor(r["after"]), expected, rtol=2e-3, atol=2e-3)
    # Both ranks of peer 0 finished with the same parameters (and trained on from the average alike).
    finals = [json.load(open(tmp_path / ("peer0.out.json.rank%d" % k))) for k in (0, 1)]
    assert finals[0] == finals[1]


@pytest.fixture
def hosts(request):
    """None (the peers on this machine's loopback), or [1, 2, 3, 4]: each peer on its own emulated
    host (scripts/cluster.sh) with a 100 Mbit/s link."""
    if request.param == "loopback":
        yield [None] * 4
        return
    with emulated_hosts(4, "100mbit") as hosts:
        yield hosts


@pytest.mark.parametrize("hosts", ["loopback", "hosts"], indirect=True)
def test_a_peer_dying_mid_run_leaves_the_others_going_and_a_new_peer_joins_in_step(hivemind_python, tmp_path, hosts):
    """3 peers train 30 steps each (a round every 6 steps' worth of samples among them); peer 2 is
    killed after its first round. Peers 0 and 1 go on averaging without it; peer 3, started after
    peer 0's second round, downloads the state of a live peer (the parameters of the last round)
    and then takes part in the rounds at the others' epoch. On loopback, and with each peer on its
    own emulated host behind a 100 Mbit/s link."""
    maddrs = str(tmp_path / "maddrs.json")
    base = dict(run_id="churn", samples=4, target=24, min_group=2, step_delay=0.3, timeout=15.0)
    # Peers 0 and 1 run long enough for the joiner to bootstrap through peer 0 and average with them.
    specs = [dict(base, steps=30, maddrs_out=maddrs), dict(base, steps=30, maddrs_in=maddrs),
             dict(base, steps=30, maddrs_in=maddrs, die_after_rounds=1)]
    procs = [start_peer(hivemind_python, tmp_path, "peer%d" % i, dict(s, peer=i), host=hosts[i])
             for i, s in enumerate(specs)]
    progress = tmp_path / "peer0.out.json.rounds"
    deadline = time.time() + 120
    while time.time() < deadline and not (progress.exists() and int(progress.read_text() or 0) >= 2):
        time.sleep(0.2)
    assert progress.exists(), "peer 0 took no round"
    joiner = start_peer(hivemind_python, tmp_path, "peer3", dict(base, steps=8, maddrs_in=maddrs, peer=3),
                        host=hosts[3])
    outputs = [p.communicate(timeout=240)[0] for p in procs + [joiner]]
    assert procs[2].returncode != 0  # killed
    for i in (0, 1, 3):
        assert [procs[0], procs[1], None, joiner][i].returncode == 0, outputs[i][-4000:]
    results = {i: json.load(open(tmp_path / ("peer%d.out.json" % i))) for i in (0, 1, 3)}
    # Rounds went on after peer 2 was gone, the last ones with the joiner (a first round may find
    # no partner yet: peers start at their own pace, and a round that finds no group is skipped).
    ok0 = [r for r in results[0]["rounds"] if r["ok"]]
    assert len(ok0) >= 2 and ok0[-1]["group"] >= 2, results[0]["rounds"]
    # Peer 3 joined at epoch e with the parameters every live peer had after round e - 1.
    e = results[3]["joined_epoch"]
    assert e >= 2, e
    # (from peer 0 or peer 1: the all-reduce's parts are reduced on different peers, so their copies
    # may differ in the last bits)
    after = {r["epoch_after"]: torch.tensor(r["after"]) for r in results[0]["rounds"]}
    joined = torch.tensor(results[3]["joined"])
    assert torch.allclose(joined, after[e], rtol=1e-6, atol=1e-8), "the joiner did not get the state of round %d" % (e - 1)
    assert not torch.allclose(joined, torch.tensor(results[0]["joined"]))  # not the initial parameters
    # ... and then averaged with the others at their epoch.
    joined_rounds = [r for r in results[3]["rounds"] if r["ok"]]
    assert joined_rounds and joined_rounds[0]["epoch"] >= e and joined_rounds[0]["group"] >= 2, results[3]["rounds"]


@pytest.mark.parametrize("hosts", ["hosts"], indirect=True)
def test_four_peers_on_100_mbit_links_one_half_as_fast_train_to_a_target_loss(hivemind_python, tmp_path, hosts):
    """bench/collaborative_train.py's MLP on Fashion-MNIST, 4 peers each on its own emulated host
    (scripts/cluster.sh) with a 100 Mbit/s link, the last one sleeping as long as its compute every
    step (half as fast): the held-out loss of peer 0 reaches 0.45 (2.3 before training), and every
    peer, the slow one too, takes part in rounds of all 4."""
    procs = []
    for k, host in enumerate(hosts):
        cmd = [CLUSTER, "exec", str(host), hivemind_python, "bench/collaborative_train.py", "--mode", "tessera",
               "--peer", str(k), "--peers", "4", "--dir", str(tmp_path), "--host", "10.213.0.%d" % host,
               "--hidden", "128", "--target-batch", "4096", "--target-loss", "0.45", "--time-limit", "90",
               "--slowdown", "2" if k == 3 else "1"]
        procs.append(subprocess.Popen(cmd, env=child_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    finish(procs, timeout=240)
    peers = [json.load(open(tmp_path / ("peer%d.json" % k))) for k in range(4)]
    assert peers[0]["reached"] is not None, peers[0]["evals"]
    assert peers[0]["evals"][0][1] > 2.0  # the loss before training
    for p in peers:
        assert any(r["group"] == 4 for r in p["round_details"]), p["round_details"]
