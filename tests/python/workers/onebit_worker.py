"""The 1-bit optimizers (optim/onebit.h) through tessera.initialize on 2 ranks, every step checked
against a plain PyTorch simulation of both ranks.

Each step of the simulation starts from the engine's own state just before that step (the
parameters, the moments, the schedule's counters, and every rank's error buffers, all-gathered), so
a difference cannot build up over steps and the 1-bit signs of the reference and the engine see the
same inputs. The simulation computes each rank's local gradient on a copy of the model, then the
optimizer's step in the order optim/onebit.cpp documents, with the compressed allreduce written out
as Tang et al. 2021 give it (worker compression, each rank the server of its chunk, per-parameter
scales). Compared: the parameters, the momentum and this rank's error buffers after the step, and the
engine's gradient norm (the RMS over ranks of the local norms once the gradients stay local).

  onebit_worker.py CASES.json OUT_FILE   (rank 0 saves, per case, the largest differences seen)
"""
import json
import math
import sys

import torch

import tessera
from parity_worker import TinyNet, global_batch
import worker_exit  # tests/python/workers/worker_exit.py: ends the rank without the interpreter's teardown

MICRO = 4


def config_of(case):
    params = {"lr": case["lr"], "weight_decay": case["weight_decay"], "betas": [0.9, 0.99]}
    params.update(case["params"])
    return {"train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 1000, "gradient_clipping": case["clip"],
            "optimizer": {"type": case["type"], "params": params}}


def gathered(t):
    """Every data-parallel rank's `t`, stacked (an all-reduce of zero-padded rows)."""
    dp, me = tessera.comm.get_world_size(), tessera.comm.get_rank()
    rows = torch.zeros((dp,) + tuple(t.shape), dtype=t.dtype)
    rows[me] = t
    return tessera.comm.all_reduce(rows, "sum", "data")


# ---- the compressed allreduce, written out --------------------------------------------------------

def compress(t, lo, bounds):
    """sign(t) × the scale of each block piece inside [lo, lo + len(t)), as float32."""
    out = torch.where(t >= 0, 1.0, -1.0).to(torch.float32)
    for b in range(len(bounds) - 1):
        begin, end = max(lo, bounds[b]), min(lo + t.numel(), bounds[b + 1])
        if begin >= end:
            continue
        scale = t[begin - lo:end - lo].norm().div(math.sqrt(end - begin))  # float32, as the engine computes it
        out[begin - lo:end - lo] *= scale
    return out


def compressed_allreduce(xs, workers, servers, bounds):
    """xs, workers, servers: every rank's input and error buffers. Returns the average every rank
    gets and the new error buffers."""
    p, n, padded = len(xs), xs[0].numel(), bounds[-1]
    chunk = padded // p
    sent, new_workers = [], []
    for r in range(p):
        b = workers[r].clone()
        b[:n] += xs[r]
        s = compress(b, 0, bounds)
        sent.append(s)
        new_workers.append(b - s)
    out, new_servers = [], []
    for s in range(p):
        c = torch.zeros(chunk)
        for r in range(p):
            c += sent[r][s * chunk:(s + 1) * chunk]
        c.mul_(1.0 / p).add_(servers[s])
        d = compress(c, s * chunk, bounds)
        out.append(d)
        new_servers.append(c - d)
    return torch.cat(out)[:n], new_workers, new_servers


# ---- the optimizers' steps, from the engine's state -----------------------------------------------

def correction(case, beta, steps):
    return 1 - beta ** steps if case["params"].get("bias_correction", True) else 1.0


def adam_update(case, p, m, v, lr, bc1, bc2):
    denom = v.sqrt().div_(math.sqrt(bc2)).add_(1e-8)
    p.mul_(1 - lr * case["weight_decay"])
    p.addcdiv_(m, denom, value=-lr / bc1)


def reference_step(case, t, state, grads, bounds, pieces):
    """One optimizer step (step count t) on flat fp32 tensors. `state` holds this step's inputs and
    is updated in place: per rank (lists) the parameters "p", "exp_avg", "momentum_accumulator" (0/1
    Adam's local steps make them differ between syncs) and the errors "workers"/"servers"; the rest
    of the named state (the same on every rank) once. grads: every rank's local gradient at its own
    parameters, already multiplied by the clip coefficient."""
    b1, b2, lr, wd = 0.9, 0.99, case["lr"], case["weight_decay"]
    ranks = range(len(grads))
    ps, ms, v = state["p"], state["exp_avg"], state["exp_avg_sq"]
    mean = sum(grads) / len(grads)  # the engine's average of two ranks: (g0 + g1) / 2
    kind, params = case["type"], case["params"]

    def average(x_per_rank):
        avg, state["workers"], state["servers"] = compressed_allreduce(x_per_rank, state["workers"], state["servers"], bounds)
        return avg

    if kind == "OneBitAdam":
        assert t > params["freeze_step"], "warm-up steps are Adam's own kernel, not simulated"
        avg = average([ms[r].clone().mul_(b1).add_(grads[r], alpha=1 - b1) for r in ranks])
        for r in ranks:
            ms[r].copy_(avg)
            adam_update(case, ps[r], ms[r], v, lr, correction(case, b1, t), correction(case, b2, params["freeze_step"]))
    elif kind == "ZeroOneAdam":
        c = state["counters"]  # var_interval, var_counter, var_updates, local_interval, local_counter, lrs
        if t <= params["var_freeze_step"]:  # every rank holds the same p and m in this phase
            if t % int(c[0]) == 0:
                v.mul_(b2).addcmul_(mean, mean, value=1 - b2)
                for r in ranks:
                    ms[r].mul_(b1).add_(mean, alpha=1 - b1)
                c[2] += 1
                c[1] += 1
                if c[1] == params["var_update_scaler"]:
                    c[1] = 0
                    c[0] *= 2
            else:
                avg = average([g.clone() for g in grads])
                for r in ranks:
                    ms[r].mul_(b1).add_(avg, alpha=1 - b1)
            for r in ranks:
                adam_update(case, ps[r], ms[r], v, lr, correction(case, b1, t), correction(case, b2, int(c[2])))
            if t == params["var_freeze_step"]:
                state["workers"] = [torch.zeros_like(w) for w in state["workers"]]
                state["servers"] = [torch.zeros_like(s) for s in state["servers"]]
            return
        bc1, bc2 = correction(case, b1, t), correction(case, b2, int(c[2]))
        c[5] += lr
        us = state["momentum_accumulator"]
        denom = v.sqrt().div_(math.sqrt(bc2)).add_(1e-8).mul_(bc1)
        for r in ranks:  # each rank's local step
            ms[r].mul_(b1).add_(grads[r], alpha=1 - b1)
            update = ms[r] / denom
            update.add_(ps[r], alpha=wd)
            ps[r].add_(update, alpha=-lr)
            us[r].add_(update, alpha=-lr)
        if t % int(c[3]) == 0:  # sync: undo the local steps, average them compressed, apply the average
            for r in ranks:
                ps[r].sub_(us[r])
            avg = average([us[r].mul_(denom) for r in ranks])
            for r in ranks:
                ms[r].copy_(avg).div_(-float(c[5]))
                ps[r].add_(avg / denom)
                us[r].zero_()
            c[5] = 0
        c[4] += 1
        if c[4] == params["local_step_scaler"]:
            c[4] = 0
            c[3] = min(params["local_step_clipper"], 2 * c[3])
    elif kind == "OneBitLamb":
        m, p = ms[0], ps[0]  # the same on every rank
        previous = m.clone()
        m.copy_(average([m.clone().mul_(b1).add_(g, alpha=1 - b1) for g in grads]))
        recovered = (m - previous * b1).div_(1 - b1)
        fresh_v = state["exp_avg_sq_fresh"]
        fresh_v.mul_(b2).addcmul_(recovered, recovered, value=1 - b2)
        bc1, bc2, bc2_fresh = correction(case, b1, t), correction(case, b2, params["freeze_step"]), correction(case, b2, t)
        trust, last = state["lamb_coeff_freeze"], state["last_factor"]
        for i, (off, n) in enumerate(pieces):
            denom = v[off:off + n].div(bc2).sqrt_().add_(1e-8)
            real = fresh_v[off:off + n].div(bc2_fresh).sqrt_().add_(1e-8)
            factor = float((denom / real).max())
            update = (m[off:off + n] / bc1).div_(denom)
            prelim_sq = float(update.square().sum())
            update.add_(p[off:off + n], alpha=wd)
            update_sq = float(update.square().sum())
            if wd != 0:
                share = min(1.0, math.sqrt(prelim_sq) / math.sqrt(update_sq)) if update_sq > 0 else 1.0
                factor = factor * share + (1 - share)
            factor = min(max(factor, params.get("factor_min", 0.5)), params.get("factor_max", 4.0))
            threshold = params.get("factor_threshold", 0.1)
            factor = min(max(factor, float(last[i]) * (1 - threshold)), float(last[i]) * (1 + threshold))
            last[i] = factor
            step_size = torch.tensor(float(trust[i]) * factor * -lr, dtype=torch.float32)
            p[off:off + n].addcmul_(update, step_size)
        for r in ranks:
            ms[r].copy_(m)
            ps[r].copy_(p)
    else:
        raise AssertionError(kind)


def local_gradients(model, flat_params, offsets, x, y):
    """Every rank's gradient of its own rows, on a copy of the model holding that rank's parameters
    (on the engine's device, so the forward runs the same kernels; returned on the CPU)."""
    dp = tessera.comm.get_world_size()
    grads = []
    for r in range(dp):
        with torch.no_grad():
            for q, (off, n, shape) in zip(model.parameters(), offsets):
                q.copy_(flat_params[r][off:off + n].view(shape))
        model.zero_grad(set_to_none=True)
        rows = slice(r * MICRO, (r + 1) * MICRO)
        device = next(model.parameters()).device
        model(x[rows].to(device), y[rows].to(device)).backward()
        g = torch.zeros_like(flat_params[r])
        for q, (off, n, _) in zip(model.parameters(), offsets):
            g[off:off + n] = q.grad.reshape(-1).cpu()
        grads.append(g)
    return grads


def run(case):
    """case["device"] ("cpu" by default; "cuda" on a GPU: the engine's tensors there, collectives
    staged through host memory by Gloo): the simulation itself runs on the CPU."""
    device = torch.device(case.get("device", "cpu"))
    model = TinyNet(case["seed"]).to(device)
    engine, _, _, _ = tessera.initialize(model=model, config=config_of(case))
    copy = TinyNet(case["seed"]).to(device)

    def optimizer_state():
        return {k: v.cpu() for k, v in engine.optimizer_state().items()}

    dp = engine.dp_world_size
    assert dp == 2
    params = list(model.parameters())
    base = params[0]
    offsets = [(q.storage_offset(), q.numel(), q.shape) for q in params]
    state_now = optimizer_state()
    n = state_now["0.exp_avg"].numel()
    # Stage 0, fp32: the parameters are views into one flat buffer laid out like the optimizer's state.
    assert all(q.untyped_storage().data_ptr() == base.untyped_storage().data_ptr() for q in params)
    assert base.untyped_storage().nbytes() == 4 * n, (base.untyped_storage().nbytes(), n)
    starts = sorted({off for off, k, _ in offsets if 0 < off < n} | {0})
    unit = 8 * dp
    bounds = starts + [(n + unit - 1) // unit * unit]
    pieces = [(off, k) for off, k, _ in offsets]  # by parameter index, as the trust ratios are kept
    flat_view = torch.zeros(n)

    def flat_params():
        for q, (off, k, _) in zip(params, offsets):
            flat_view[off:off + k] = q.detach().reshape(-1).cpu()
        return flat_view.clone()

    worst = {"params": 0.0, "exp_avg": 0.0, "errors": 0.0, "norm": 0.0}
    phases, simulated = [], 0
    for step in range(case["steps"]):
        t = step + 1
        x, y = global_batch({"micro": MICRO, "gas": 1, "dp": dp, "seed": case["seed"]}, step)
        averaged = t <= case["params"].get("freeze_step", 0) or (
            case["type"] == "ZeroOneAdam" and t <= case["params"]["var_freeze_step"]
            and t % int(optimizer_state()["0.counters"][0]) == 0)
        before = None
        if not (case["type"] != "ZeroOneAdam" and averaged):
            st = optimizer_state()
            before = {k.split(".", 1)[1]: v.clone() for k, v in st.items() if not k.endswith("_error")}
            for key in ("exp_avg", "momentum_accumulator"):  # per rank
                if key in before:
                    before[key] = list(gathered(before[key]))
            before["p"] = list(gathered(flat_params()))
            before["workers"] = list(gathered(st["0.worker_error"]))
            before["servers"] = list(gathered(st["0.server_error"]))
            grads = local_gradients(copy, before["p"], offsets, x, y)
        me = engine.dp_rank
        rows = slice(me * MICRO, (me + 1) * MICRO)
        loss = engine(x[rows].to(device), y[rows].to(device))
        engine.backward(loss)
        engine.step()
        phases.append(engine.optimizer_phase)
        if before is None:
            continue
        # The engine's norm: of the average when it averaged, else the RMS of the local norms.
        norms = [float(g.norm()) for g in grads]
        expected_norm = float(sum(grads).div(2).norm()) if averaged else math.sqrt(sum(x * x for x in norms) / 2)
        norm = engine.get_global_grad_norm()
        worst["norm"] = max(worst["norm"], abs(norm - expected_norm) / expected_norm)
        coefficient = case["clip"] / (norm + 1e-6) if case["clip"] > 0 and norm > case["clip"] else 1.0
        grads = [g * torch.tensor(coefficient, dtype=torch.float32) for g in grads] if coefficient != 1.0 else grads
        reference_step(case, t, before, grads, bounds, pieces)
        simulated += 1
        after = optimizer_state()
        worst["params"] = max(worst["params"], float((flat_params() - before["p"][me]).abs().max()))
        worst["exp_avg"] = max(worst["exp_avg"], float((after["0.exp_avg"] - before["exp_avg"][me]).abs().max()))
        worst["errors"] = max(worst["errors"],
                              float((after["0.worker_error"] - before["workers"][me]).abs().max()),
                              float((after["0.server_error"] - before["servers"][me]).abs().max()))
        for key in ("momentum_accumulator", "exp_avg_sq_fresh", "counters", "last_factor"):
            if key in before:
                mine = before[key][me] if key == "momentum_accumulator" else before[key]
                worst[key] = max(worst.get(key, 0.0), float((after["0." + key] - mine).abs().max()))
    return {"worst": worst, "phases": phases, "simulated": simulated, "state": sorted(engine.optimizer_state())}


def main():
    if "--gloo" in sys.argv[3:]:  # ranks sharing one GPU: Gloo, collectives staged through host memory
        tessera.init_distributed(dist_backend="gloo")
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    results = [run(case) for case in cases]
    if tessera.comm.get_rank() == 0:
        torch.save(results, sys.argv[2])


if __name__ == "__main__":
    worker_exit.run(main)
