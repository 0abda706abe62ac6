"""One peer of the collaborative-training benchmark (bench/run_collaborative.sh): an MLP on Debian's
Fashion-MNIST, trained until the loss on 2000 held-out images reaches a target, by one of

  alone           tessera's engine, this peer by itself (no collaboration)
  tessera         tessera's engine + tessera.collaborative.Collaboration (parameter averaging)
  tessera-diloco  the same with DiLoCo's outer Nesterov step (--outer-lr, --outer-momentum)
  hivemind        plain PyTorch + hivemind.Optimizer (gradients accumulated to the target batch,
                  averaged, then one Adam step on every peer: Hivemind's default)
  hivemind-local  plain PyTorch + hivemind.Optimizer(use_local_updates=True) (an Adam step every
                  local batch, parameters averaged every target batch: Hivemind's parameter averaging)

Every mode: the same model and initialization, Adam at the same learning rate, the same local batch,
the same target batch size (all peers together between averaging rounds), and --compression on the
averaged tensors. Peer 0 (a full-speed peer) evaluates every --eval-every seconds and stops the run
when the held-out loss reaches --target-loss (the mean of its last 3 evaluations, so that one lucky
evaluation does not count) or after --time-limit; the clock starts when all --peers peers are up.
--slowdown F makes a peer F times slower (it sleeps F - 1 times each step's forward and backward).

  collaborative_train.py --mode M --peer K --peers N --dir RUN_DIR --host ADDR [...]

Writes RUN_DIR/peerK.json: {"mode", "peer", "steps", "samples", "rounds", "round_details" (tessera's:
seconds and group size of each round), "evals": [[seconds, loss]], "reached": seconds or null}.
Runs in the Hivemind venv (bench/setup_hivemind.sh)."""
import argparse
import glob
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
from data import FashionMnist  # noqa: E402


class Mlp(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        nn = torch.nn
        self.layers = nn.Sequential(nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                    nn.Linear(hidden, 10))

    def forward(self, x, y):
        return F.cross_entropy(self.layers(x.reshape(x.shape[0], -1)), y)


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True,
                    choices=["alone", "tessera", "tessera-diloco", "hivemind", "hivemind-local"])
    ap.add_argument("--peer", type=int, default=0)
    ap.add_argument("--peers", type=int, default=1)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--target-batch", type=int, default=2048)
    ap.add_argument("--compression", default="none", choices=["none", "fp16", "8bit"])
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--matchmaking", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--group-size", type=int, default=None, help="target_group_size (default: --peers)")
    ap.add_argument("--slowdown", type=float, default=1.0)
    ap.add_argument("--target-loss", type=float, default=0.45)
    ap.add_argument("--eval-every", type=float, default=2.0)
    ap.add_argument("--time-limit", type=float, default=180.0)
    return ap.parse_args()


def join_dht(args):
    """Peer 0 starts the DHT and writes its addresses; the others join through them."""
    import hivemind
    maddrs = os.path.join(args.dir, "maddrs.json")
    listen = ["/ip4/%s/tcp/0" % args.host]
    if args.peer == 0:
        dht = hivemind.DHT(host_maddrs=listen, start=True)
        with open(maddrs + ".tmp", "w") as f:
            json.dump([str(a) for a in dht.get_visible_maddrs()], f)
        os.replace(maddrs + ".tmp", maddrs)
        return dht
    while not os.path.exists(maddrs):
        time.sleep(0.1)
    return hivemind.DHT(initial_peers=json.load(open(maddrs)), host_maddrs=listen, start=True)


class TesseraPeer:
    """tessera's engine; with a DHT, its Collaboration."""

    def __init__(self, args, model, dht):
        import tessera
        import tessera.collaborative
        config = {"train_micro_batch_size_per_gpu": args.batch, "steps_per_print": 10**9,
                  "optimizer": {"type": "Adam", "params": {"lr": args.lr}}}
        self.engine, _, _, _ = tessera.initialize(model=model, config=config)
        self.module = self.engine.module
        self.collab = None
        if dht is not None:
            outer = args.outer_lr if args.mode == "tessera-diloco" else None
            self.collab = tessera.collaborative.Collaboration(
                self.engine, run_id="bench", target_batch_size=args.target_batch, dht=dht, outer_lr=outer,
                outer_momentum=args.outer_momentum, compression=args.compression,
                matchmaking_time=args.matchmaking, averaging_timeout=args.timeout,
                target_group_size=args.group_size or args.peers)

    def train_step(self, x, y):
        """Returns the seconds of forward and backward (what a slower peer takes longer for)."""
        began = time.monotonic()
        loss = self.engine(x, y)
        self.engine.backward(loss)
        compute = time.monotonic() - began
        self.engine.step()
        if self.collab is not None:
            self.collab.step(len(x))
        return compute

    def rounds(self):
        return len(self.collab.rounds) if self.collab else 0

    def round_details(self):
        return [{"seconds": round(r["seconds"], 3), "group": r["group"], "started": r["started"]}
                for r in self.collab.rounds] if self.collab else []

    def shutdown(self):
        if self.collab:
            self.collab.shutdown()


class HivemindPeer:
    """Plain PyTorch with hivemind.Optimizer (Hivemind's own training loop)."""

    def __init__(self, args, model, dht):
        import hivemind
        from tessera.collaborative import wire_compression  # the same codecs as tessera's mode
        self.module = model
        local = args.mode == "hivemind-local"
        compression = wire_compression(args.compression)
        self.opt = hivemind.Optimizer(
            dht=dht, run_id="bench", target_batch_size=args.target_batch, batch_size_per_step=args.batch,
            params=model.parameters(), optimizer=lambda params: torch.optim.Adam(params, lr=args.lr),
            matchmaking_time=args.matchmaking, averaging_timeout=args.timeout, use_local_updates=local,
            grad_compression=compression, state_averaging_compression=compression,
            tracker_opts=dict(min_refresh_period=0.2, max_refresh_period=1.0, default_refresh_period=0.5),
            averager_opts=dict(target_group_size=args.group_size or args.peers),
            verbose=False)
        self.opt.load_state_from_peers()

    def train_step(self, x, y):
        began = time.monotonic()
        self.opt.zero_grad()
        loss = self.module(x, y)
        loss.backward()
        compute = time.monotonic() - began
        self.opt.step()
        return compute

    def rounds(self):
        return self.opt.local_epoch

    def round_details(self):
        return []  # Hivemind averages in the background (delay_state_averaging)

    def shutdown(self):
        self.opt.shutdown()


def wait_for_everyone(args):
    """A start line: every peer is up (connected, state loaded) before the clock starts."""
    open(os.path.join(args.dir, "ready.%d" % args.peer), "w").close()
    while len(glob.glob(os.path.join(args.dir, "ready.*"))) < args.peers:
        time.sleep(0.05)


def main():
    args = parse()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # every peer starts from the same parameters
    model = Mlp(args.hidden)
    data = FashionMnist()
    test_x, test_y = data.range(0, 2000, split="test")
    dht = join_dht(args) if args.mode != "alone" else None
    peer = (HivemindPeer if args.mode.startswith("hivemind") else TesseraPeer)(args, model, dht)
    wait_for_everyone(args)

    done = os.path.join(args.dir, "done")
    start = last_eval = time.monotonic()
    with torch.no_grad():
        evals, reached, step = [[0.0, float(peer.module(test_x, test_y))]], None, 0
    while not os.path.exists(done):
        x, y = data.sample(args.batch, step, seed=1000 + args.peer)
        compute = peer.train_step(x, y)
        step += 1
        if args.slowdown > 1:
            time.sleep((args.slowdown - 1) * compute)
        now = time.monotonic()
        if args.peer == 0 and now - last_eval >= args.eval_every:
            with torch.no_grad():
                loss = float(peer.module(test_x, test_y))
            evals.append([round(now - start, 3), loss])
            last_eval = now
            smoothed = sum(l for _, l in evals[-3:]) / len(evals[-3:])  # one lucky evaluation is not enough
            if (len(evals) >= 3 and smoothed <= args.target_loss) or now - start > args.time_limit:
                reached = now - start if smoothed <= args.target_loss else None
                open(done, "w").close()
    result = {"mode": args.mode, "peer": args.peer, "steps": step, "samples": step * args.batch,
              "rounds": peer.rounds(), "round_details": peer.round_details(), "evals": evals, "reached": reached,
              "seconds": time.monotonic() - start}
    with open(os.path.join(args.dir, "peer%d.json" % args.peer), "w") as f:
        json.dump(result, f)
    peer.shutdown()
    if dht is not None:
        dht.shutdown()


if __name__ == "__main__":
    main()
