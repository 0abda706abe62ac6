"""DeepSpeed's communication logger (its comms_logger config and deepspeed.comm.log_summary), from
the statistics every tessera communicator keeps of its own collectives (parallel/communicator.h:
calls, bytes, and the seconds from each call until its wait returned, by collective and message
size), on every group made so far: data, tensor, pipe, context, ZeRO-3's parameter channel, the MoE
layers' expert groups.

    engine.comms_logger.log_summary()                 # every rank calls it; rank 0 prints the table
    summary = engine.comms_logger.log_summary(return_dict=True)
    tessera.comm.log_summary()                        # the same without an engine (deepspeed.comm's)

Config (DeepSpeed's keys): {"comms_logger": {"enabled": true, "verbose": false, "prof_all": true,
"prof_ops": [], "debug": false}}. prof_all false keeps only the collectives named in prof_ops
("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "send", "recv",
"barrier"); verbose prints, at every optimizer step, the collectives that step issued; debug adds
the time callers spent blocked in wait() (the part of the latency not hidden behind compute).

The figures, per group, collective and message size: count, total and mean latency (ms), algorithm
bandwidth (the message's bytes over the mean latency) and bus bandwidth with the standard factors
of NCCL's tests, n the group's size: all_reduce 2(n−1)/n, reduce_scatter, all_gather and
all_to_all (n−1)/n (their message is the whole buffer, n chunks), the rest 1. (DeepSpeed uses the
world size for n and reports twice the algorithm bandwidth of an all_reduce.) Gbps = 10⁹ bits/s.
The latency is measured from the call to the return of its wait, so for a collective overlapped with
compute it bounds the communication time from above.
"""
import math

__all__ = ["CommsLogger", "bus_factor", "summary"]

_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "send", "recv", "barrier")
_WIDTH = 20


def bus_factor(op, n):
    """Bus bandwidth over algorithm bandwidth for `op` on a group of n ranks."""
    if n <= 1:
        return 1.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _size_str(nbytes):
    """DeepSpeed's convert_size: 1024-based, one decimal."""
    if nbytes <= 0:
        return "0B"
    names = ("B", "KB", "MB", "GB", "TB", "PB")
    i = min(int(math.floor(math.log(nbytes, 1024))), len(names) - 1)
    return "%s %s" % (round(nbytes / math.pow(1024, i), 2), names[i])


def summary(context, ops=None, reset=False):
    """{group: {"size": n, "ops": {op: {message bytes: {count, total_latency_ms, avg_latency_ms,
    algbw_gbps, busbw_gbps, msg_size_bytes, msg_size_str, blocked_ms}}}}} from `context`'s
    communicators; `ops`: the collectives to keep (None: all); reset: zero the statistics after."""
    out = {}
    for group, n, stats in context.stats_by_size(reset):
        rows = {}
        for (op, nbytes), (calls, total_bytes, seconds, _sent, blocked) in sorted(stats.items()):
            if calls == 0 or (ops is not None and op not in ops):
                continue
            avg_s = seconds / calls
            algbw = nbytes * 8 / 1e9 / avg_s if avg_s > 0 else 0.0
            rows.setdefault(op, {})[nbytes] = {
                "count": calls, "total_latency_ms": 1000 * seconds, "avg_latency_ms": 1000 * avg_s,
                "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(op, n), "msg_size_bytes": nbytes,
                "msg_size_str": _size_str(nbytes), "blocked_ms": 1000 * blocked}
        if rows:
            out[group] = {"size": n, "ops": rows}
    return out


def _table(s, debug):
    columns = ["Comm. Op", "Message Size", "Count", "Total Latency(ms)", "Avg Latency(ms)", "tput_avg (Gbps)",
               "busbw_avg (Gbps)"] + (["Blocked(ms)"] if debug else [])
    lines = ["".join(c.ljust(_WIDTH) for c in columns)]
    for group, g in s.items():
        for op, sizes in g["ops"].items():
            lines.append("%s [%s, %d ranks]" % (op, group, g["size"]))
            for r in sizes.values():
                cells = ["", r["msg_size_str"], str(r["count"]), "%.2f" % r["total_latency_ms"],
                         "%.2f" % r["avg_latency_ms"], "%.2f" % r["algbw_gbps"], "%.2f" % r["busbw_gbps"]]
                if debug:
                    cells.append("%.2f" % r["blocked_ms"])
                lines.append("".join(c.ljust(_WIDTH) for c in cells))
    return "\n".join(lines)


class CommsLogger:
    """The engine's comms logger (engine.comms_logger); `section` is the config's comms_logger."""

    def __init__(self, context, section=None):
        section = section or {}
        self.context = context
        self.enabled = bool(section.get("enabled", False))
        self.verbose = bool(section.get("verbose", False))
        self.prof_all = bool(section.get("prof_all", True))
        self.prof_ops = list(section.get("prof_ops", []))
        self.debug = bool(section.get("debug", False))
        self._at_last_step = None

    def configure(self, enabled=None, prof_all=None, prof_ops=None, verbose=None, debug=None):
        """deepspeed.comm.configure's switches, at run time."""
        for name, value in (("enabled", enabled), ("prof_all", prof_all), ("prof_ops", prof_ops),
                            ("verbose", verbose), ("debug", debug)):
            if value is not None:
                setattr(self, name, list(value) if name == "prof_ops" else bool(value))

    def _ops(self):
        return None if self.prof_all else set(self.prof_ops)

    def log_summary(self, show_straggler=False, return_dict=False):
        """Every rank calls it (show_straggler takes a collective); rank 0 prints the table of this
        rank's collectives since the start (DeepSpeed's log_summary). show_straggler: per collective,
        the total latency's minimum over the world and this rank's excess over it. return_dict: the
        summary as a dict (summary()'s, under "summary", with "straggler_analysis" and "metadata")."""
        s = summary(self.context, self._ops())
        straggler = self._stragglers(s) if show_straggler else None
        rank = self.context.rank
        if rank == 0:
            print(_table(s, self.debug), flush=True)
            if straggler is not None:
                print("".join(c.ljust(_WIDTH) for c in ("Comm. Op", "Total comm lat(ms)", "Total straggler(ms)")))
                for op, (own, least) in straggler.items():
                    print("".join(c.ljust(_WIDTH) for c in (op, "%.2f" % least, "%.2f" % (own - least))), flush=True)
        if return_dict:
            return {"summary": s, "straggler_analysis": straggler,
                    "metadata": {"world_size": self.context.world_size, "rank": rank}}
        return None

    def _stragglers(self, s):
        """{op: (this rank's total latency ms, the minimum over the world)} over a fixed list of ops."""
        import torch
        own = torch.zeros(len(_OPS), dtype=torch.float64)
        for g in s.values():
            for op, sizes in g["ops"].items():
                if op in _OPS:
                    own[_OPS.index(op)] += sum(r["total_latency_ms"] for r in sizes.values())
        least = own.clone().to(self.context.device)
        self.context.all_reduce(least, "min", "world")
        least = least.cpu()
        return {op: (own[i].item(), least[i].item()) for i, op in enumerate(_OPS) if own[i] > 0 or least[i] > 0}

    def after_step(self, step):
        """verbose: rank 0 prints what the step's collectives took (called by the engine)."""
        if not (self.enabled and self.verbose):
            return
        now = summary(self.context, self._ops())
        last, self._at_last_step = self._at_last_step or {}, now
        if self.context.rank != 0:
            return
        for group, g in now.items():
            for op, sizes in g["ops"].items():
                for nbytes, r in sizes.items():
                    before = last.get(group, {}).get("ops", {}).get(op, {}).get(nbytes)
                    count = r["count"] - (before["count"] if before else 0)
                    if count <= 0:
                        continue
                    ms = r["total_latency_ms"] - (before["total_latency_ms"] if before else 0.0)
                    algbw = nbytes * count * 8 / 1e6 / ms if ms > 0 else 0.0
                    print("step %d | comm op: %s [%s] x%d | time (ms): %.2f | msg size: %s | algbw (Gbps): %.2f | "
                          "busbw (Gbps): %.2f" % (step, op, group, count, ms / count, r["msg_size_str"], algbw,
                                                  algbw * bus_factor(op, g["size"])), flush=True)
