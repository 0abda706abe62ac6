"""Collaborative training over slow, unreliable peers: Hivemind's parameter averaging around a
tessera engine (Diskin et al. 2021, "Distributed Deep Learning In Open Collaborations"; Ryabinin et
al. 2021, "Moshpit SGD"), optionally with DiLoCo's outer optimizer (Douillard et al. 2023).

Each peer is one tessera job (one process, or a group of ranks with ZeRO inside it) that trains at
its own pace with its own optimizer. The peers find each other through Hivemind's DHT and count
the samples they process toward a global target batch size (Hivemind's ProgressTracker). When the
peers together reach it, an averaging round starts over the peers alive at that moment (Hivemind's
DecentralizedAverager: matchmaking, then a butterfly all-reduce), each peer's parameters weighted by
the samples it processed since the last round:

    θ ← Σ_p s_p θ_p / Σ_p s_p

The group is gathered ahead of time, as hivemind.Optimizer does: when the tracker expects the target
within matchmaking_time, matchmaking starts in the background and the all-reduce waits for the
peer's trigger, so a round costs the all-reduce, not the matchmaking too.

With an outer optimizer (DiLoCo) the peers average their change since the last round instead,
Δ_p = θ_anchor − θ_p, and every peer applies the same outer step to the shared anchor (SGD with
Nesterov momentum, DiLoCo's choice): m ← μ m + Δ̄, θ_anchor ← θ_anchor − η (Δ̄ + μ m), θ_p ← θ_anchor.
The averaged tensors travel compressed ("fp16" or "8bit": Hivemind's Float16Compression and
Uniform8BitQuantization). A peer that dies mid-round is left out of it after the averaging timeout
(the others keep their result, or their own values when the round fails); a peer that joins later
downloads the current state (the anchor, or the last averaged parameters) from a live one.

Hivemind is an optional dependency (`pip install hivemind`; bench/setup_hivemind.sh makes a venv
with it that reuses this one's torch and tessera):

    engine, *_ = tessera.initialize(model=model, config=config)
    collab = tessera.collaborative.Collaboration(engine, run_id="gpt", target_batch_size=4096,
                                                 initial_peers=["/ip4/10.0.0.1/tcp/31337/p2p/Qm..."])
    for batch in data:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
        collab.step(len(batch))   # every rank of the peer, after each step()

docs/collaborative.md has the details; tests/python/collaborative/ the tests."""
import threading
import time

import torch

from . import comm

__all__ = ["Collaboration", "wire_compression"]

_COMPRESSIONS = ("none", "fp16", "8bit")


def _hivemind():
    try:
        import hivemind
    except ImportError as e:
        raise ImportError("tessera.collaborative needs the hivemind package (pip install hivemind; "
                          "bench/setup_hivemind.sh makes a venv with it): %s" % e) from None
    return hivemind


def wire_compression(name):
    """Hivemind's codec for the averaged tensors: "none", "fp16" or "8bit" (_COMPRESSIONS)."""
    codecs = _hivemind().compression
    return {"none": codecs.NoCompression, "fp16": codecs.Float16Compression,
            "8bit": codecs.Uniform8BitQuantization}[name]()


def _averager_class(hivemind):
    """Hivemind's averager, sharing the Collaboration's state (not the tensors it averages, which
    hold deltas during a DiLoCo round) with peers that join."""

    class StateSharingAverager(hivemind.averaging.DecentralizedAverager):
        def __init__(self, *args, state_source, **kwargs):
            self._state_source = state_source
            super().__init__(*args, **kwargs)

        def get_current_state(self):
            metadata, tensors = self._state_source()
            return metadata, tensors, None

    return StateSharingAverager


class Collaboration:
    """Parameter averaging among peers toward a global batch (module docstring).

    engine: a tessera engine (tessera.initialize's); its module's parameters are averaged.
    run_id: the collaboration's name on the DHT (peers with the same run_id train together).
    target_batch_size: samples all peers together process between averaging rounds.
    initial_peers: multiaddresses of peers already running (none: this peer starts the run); or
    dht: a hivemind.DHT of the caller's.
    outer_lr, outer_momentum: set outer_lr for DiLoCo's outer Nesterov step (None: plain averaging).
    compression: "none", "fp16" or "8bit" for the averaged tensors on the wire.
    matchmaking_time, averaging_timeout: seconds to gather a group, and to finish a round.
    min_group_size: peers needed for a round (fewer: the round is skipped, training goes on).
    target_group_size: the most peers in one group; a group that has them starts its all-reduce at
    once instead of at the end of matchmaking_time (None: no limit, always the whole matchmaking_time).
    report_period: the fewest seconds between this peer's progress reports to the DHT.
    host_maddrs: where this peer's DHT listens (the leader rank's)."""

    def __init__(self, engine, run_id, target_batch_size, initial_peers=(), dht=None, outer_lr=None,
                 outer_momentum=0.9, compression="none", matchmaking_time=3.0, averaging_timeout=30.0,
                 min_group_size=2, target_group_size=None, report_period=0.25, host_maddrs=("/ip4/0.0.0.0/tcp/0",),
                 load_state=True):
        if compression not in _COMPRESSIONS:
            raise ValueError("tessera.collaborative: compression %r: expected one of %s" % (compression, _COMPRESSIONS))
        if target_batch_size <= 0:
            raise ValueError("tessera.collaborative: target_batch_size must be positive, got %r" % target_batch_size)
        self.engine = engine
        self.target_batch_size = int(target_batch_size)
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.averaging_timeout = averaging_timeout
        self.matchmaking_time = matchmaking_time
        self._scheduled = None  # a round whose matchmaking started ahead of the target (hivemind StepControl)
        self.report_period = report_period
        self._reported = -float("inf")
        self._params = [p for p in engine.module.parameters() if p.requires_grad]
        self._leader = comm.get_rank() == 0  # the peer's rank that talks to the others
        self.local_epoch = 0  # averaging rounds this peer has taken part in (or caught up with)
        self.samples = 0      # samples since the last round, this peer
        self.rounds = []      # one dict per round: epoch, group size, weight, seconds, ok
        numel = sum(p.numel() for p in self._params)
        self._flat = torch.zeros(numel, dtype=torch.float32)  # what the averager averages
        self._state = self._read_parameters()                 # what a joining peer downloads
        self._state_lock = threading.Lock()
        self._momentum = torch.zeros(numel, dtype=torch.float32) if outer_lr is not None else None
        self.dht = self.tracker = self.averager = None
        self._own_dht = False
        try:
            self._start(run_id, initial_peers, dht, host_maddrs, compression, min_group_size, target_group_size)
            if load_state:
                self._join()
        except BaseException:
            self.shutdown()  # Hivemind's threads and processes would keep the process alive
            raise

    def _start(self, run_id, initial_peers, dht, host_maddrs, compression, min_group_size, target_group_size):
        if self._leader:
            hivemind = _hivemind()
            self._own_dht = dht is None  # a caller's DHT stays up after shutdown()
            self.dht = dht or self._connect(hivemind, initial_peers, host_maddrs)
            self.tracker = hivemind.optim.progress_tracker.ProgressTracker(
                self.dht, prefix="%s_progress" % run_id, target_batch_size=self.target_batch_size, start=True,
                min_refresh_period=0.2, max_refresh_period=1.0, default_refresh_period=0.5)
            self.averager = _averager_class(hivemind)(
                [self._flat], self.dht, start=True, prefix="%s_averaging" % run_id, min_group_size=min_group_size,
                target_group_size=target_group_size, min_matchmaking_time=self.matchmaking_time,
                request_timeout=min(3.0, self.matchmaking_time / 2),  # below matchmaking_time (Hivemind's advice)
                allreduce_timeout=self.averaging_timeout, compression=wire_compression(compression),
                allow_state_sharing=True, state_source=self._shared_state)

    @staticmethod
    def _connect(hivemind, initial_peers, host_maddrs, attempts=3):
        """The DHT, bootstrapped from initial_peers: on a slow or lossy link the first contact can
        fail, so it is tried again (3 times, 2 s apart) before the error is raised."""
        for attempt in range(attempts):
            try:
                return hivemind.DHT(initial_peers=list(initial_peers), host_maddrs=list(host_maddrs), start=True)
            except Exception as e:  # hivemind's P2PDaemonError: "failed to connect to bootstrap peers"
                if attempt + 1 == attempts or not initial_peers:
                    raise RuntimeError("tessera.collaborative: cannot join the DHT through %s: %s"
                                       % (", ".join(map(str, initial_peers)) or "(no initial peers)", e)) from e
                time.sleep(2.0)

    # ---- what peers see ------------------------------------------------------------------------

    def visible_maddrs(self):
        """This peer's DHT addresses, for others' initial_peers (leader rank; [] elsewhere)."""
        return [str(a) for a in self.dht.get_visible_maddrs()] if self.dht else []

    def _shared_state(self):
        with self._state_lock:
            return {"epoch": self.local_epoch}, [self._state.clone()]

    # ---- training ------------------------------------------------------------------------------

    def step(self, samples):
        """After each engine.step() at an accumulation boundary, on every rank of the peer:
        `samples` this peer processed (all its ranks together). Averages with the other peers when
        they together reached target_batch_size. Returns True when a round ran."""
        self.samples += int(samples)
        go = torch.zeros(1)
        if self._leader:
            # Each report is a DHT store that every peer's DHT process handles: at tens of steps a
            # second they took a third of the CPU of 4 peers on 2 cores. A few a second are enough.
            now = time.monotonic()
            if now - self._reported >= self.report_period:
                self.tracker.report_local_progress(self.local_epoch, self.samples)
                self._reported = now
            # Hivemind's own readiness also fires on its estimate of when the target will be reached;
            # a round here starts when the samples are there (or another peer has moved on).
            progress = self.tracker.global_progress
            ready = progress.epoch > self.local_epoch or progress.samples_accumulated >= self.target_batch_size
            go[0] = 1.0 if ready else 0.0
            if not ready:
                self._maybe_schedule(progress)
        self._broadcast(go)
        if go.item() == 0:
            return False
        self._average()
        return True

    def _maybe_schedule(self, progress):
        """Matchmaking ahead of the round, as hivemind.Optimizer does: once the tracker expects the
        target within matchmaking_time, this peer starts gathering a group, so that the all-reduce
        begins as soon as the samples are there instead of matchmaking_time later."""
        if self._scheduled is not None and not self._scheduled.done():
            return
        # Only on fresh counts of this round, half-way there: right after a round the tracker's
        # estimate is stale, and a group gathered then would take in peers still finishing the
        # last round (whose all-reduce would wait a whole round for this peer's trigger).
        if progress.epoch != self.local_epoch or progress.samples_accumulated < self.target_batch_size // 2:
            return
        now = _hivemind().utils.get_dht_time()
        eta = self.tracker.estimated_next_update_time - now
        if eta <= self.matchmaking_time:
            self._scheduled = self.averager.step(scheduled_time=now + max(eta, self.matchmaking_time), wait=False,
                                                 require_trigger=True, timeout=self.averaging_timeout)

    def _all_reduce(self, weight):
        """This round's all-reduce of self._flat (the scheduled one, or one that gathers its group
        now), weighted; returns the group's size (None: no group, or it failed)."""
        control, self._scheduled = self._scheduled, None
        if control is None or control.done():
            control = self.averager.step(wait=False, require_trigger=True, timeout=self.averaging_timeout)
        control.weight = weight
        control.allow_allreduce()
        gathered = control.result(timeout=self.averaging_timeout)
        return len(gathered) if gathered else None

    def _average(self):
        start = time.monotonic()
        params = self._read_parameters()
        record = {"epoch": self.local_epoch, "weight": self.samples, "group": 1, "ok": False, "started": time.time()}
        if self._leader:
            with self.tracker.pause_updates():
                with self.averager.get_tensors() as tensors:
                    tensors[0].copy_(params if self.outer_lr is None else self._state - params)
                try:
                    group = self._all_reduce(float(max(self.samples, 1)))
                    record["ok"] = group is not None
                    record["group"] = group or 1
                except Exception as e:  # a dead peer, a timeout: this peer keeps its own values
                    record["error"] = "%s: %s" % (type(e).__name__, e)
                with self.averager.get_tensors() as tensors:
                    averaged = tensors[0].clone() if record["ok"] else None
                if self.outer_lr is None:
                    new = averaged if averaged is not None else params
                else:  # DiLoCo: the outer Nesterov step on the shared anchor with the averaged change
                    delta = averaged if averaged is not None else self._state - params
                    self._momentum.mul_(self.outer_momentum).add_(delta)
                    new = self._state - self.outer_lr * (delta + self.outer_momentum * self._momentum)
                self.local_epoch = max(self.local_epoch + 1, self.tracker.global_epoch)
                self.tracker.update_epoch(self.local_epoch)
        else:
            new = torch.empty_like(params)
        self._write_parameters(new)
        with self._state_lock:
            self._state = self._read_parameters()
        self.samples = 0
        record["seconds"] = time.monotonic() - start
        self.rounds.append(record)

    def _join(self):
        """A peer joining a run already under way takes the state of a live peer."""
        loaded = None
        if self._leader and self.tracker.global_progress.epoch > 0:
            loaded = self.averager.load_state_from_peers(timeout=self.averaging_timeout)
        flag = torch.tensor([1.0 if loaded else 0.0])
        self._broadcast(flag)
        if flag.item() == 0:
            return
        state = loaded[1][0].float() if self._leader else torch.empty_like(self._flat)
        if self._leader:
            self.local_epoch = int(loaded[0]["epoch"])
            self.tracker.report_local_progress(self.local_epoch, 0)
        self._write_parameters(state)
        with self._state_lock:
            self._state = self._read_parameters()

    # ---- the engine's parameters ---------------------------------------------------------------

    def _read_parameters(self):
        """The peer's parameters as one fp32 vector in host memory (where Hivemind averages; on GPU
        ranks too)."""
        with self.engine.gathered_parameters():  # ZeRO-3: whole while read
            return torch.cat([p.detach().float().reshape(-1).cpu() for p in self._params])

    def _write_parameters(self, flat):
        """The leader's values become every rank's parameters (and fp32 masters)."""
        self.engine.set_parameters(flat, src=0)

    def _broadcast(self, t):
        if comm.get_world_size() > 1:
            torch.distributed.broadcast(t, 0)

    def shutdown(self):
        """Leaves the collaboration: the averager, the progress tracker and (unless it was the
        caller's) the DHT stop."""
        if self._scheduled is not None and not self._scheduled.done():
            self._scheduled.cancel()
        for part in (self.averager, self.tracker, self.dht if self._own_dht else None):
            if part is not None:
                part.shutdown()
        self.averager = self.tracker = self.dht = None
