#!/usr/bin/env python3
"""The layout planner against the measured sweep (issue 50's benchmark).

Asks `tessera plan --json` for every layout of the example GPT (build/bin/train_gpt) on R ranks
and a fixed global batch that it considers feasible (data/tensor/pipeline degrees, ZeRO 0-3,
micro-batch; no offload, checkpointing or context parallelism unless asked), runs each one for a
few steps with the real engine, and compares: the planner's first choice measured against the
measured best, the best of its top 3 (three trials) against the same, and the Spearman rank
correlation between predicted and measured step times. Prints one JSON line and a Markdown table.

    bench/planner_sweep.py [--ranks 4] [--global-batch 8] [--steps 4] [--plan-args ...]
                           [--ranks-per-node 2 --hostfile F --launch-args JSON]

Each layout's step time is the median of its progress lines' "step X ms" after the first step
(warm-up). --hostfile runs every layout across emulated hosts (scripts/cluster.sh) instead of one.

Ranks sharing cores make one sweep noisy (on the 2-core VM two sweeps of the same 44 layouts
agreed to a rank correlation of 0.74, a median 9% apart), so earlier sweeps' rows can join this
one: --measured FILE (repeatable; this script's --out of the same layouts) averages each layout's
time over the sweeps and reports the sweeps' rank correlation with each other, the ceiling any
prediction can reach; with --no-run nothing is run again (the planner's present model against
the stored measurements).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = os.path.join(ROOT, "build", "bin", "tessera")
TRAIN_GPT = os.path.join(ROOT, "build", "bin", "train_gpt")
# Across hosts the launcher prefixes each line with its host and rank ("10.213.0.1: [rank0]: step 2 | ...").
STEP = re.compile(r"(?:^|: )step (\d+) \|.*\| step ([0-9.]+) ms")


def ranks_of(values):
    """Average ranks (1-based) of `values`, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs, ys):
    """Spearman's rank correlation: Pearson's on the ranks."""
    rx, ry = ranks_of(xs), ranks_of(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else float("nan")


def plan(args):
    cmd = [CLI, "plan", "--json", "--top", "100000", "--device", "cpu", "--gpus-per-node", str(args.ranks_per_node),
           "--nodes", str(args.ranks // args.ranks_per_node), "--global-batch", str(args.global_batch),
           "--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads),
           "--vocab", "256", "--seq-len", str(args.seq_len), "--max-positions", str(args.seq_len)]
    cmd += args.plan_args.split() if args.plan_args else ["--no-offload", "--activation-checkpointing", "none", "--no-cp"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def measure(layout_config, args, workdir, index):
    config = dict(layout_config)
    config["steps_per_print"] = 1
    path = os.path.join(workdir, "layout%d.json" % index)
    with open(path, "w") as f:
        json.dump(config, f)
    launch = [CLI, "launch", "--master-port", str(args.port + index)]
    if args.hostfile:
        launch += ["--hostfile", args.hostfile] + json.loads(args.launch_args or "[]")
    else:
        launch += ["--nproc-per-node", str(args.ranks)]
    cmd = launch + ["--", TRAIN_GPT, "--config", path, "--steps", str(args.steps), "--n-layer", str(args.layers),
                    "--n-head", str(args.heads), "--n-embd", str(args.hidden), "--seq-len", str(args.seq_len)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    steps = [float(m.group(2)) for line in run.stdout.splitlines() if (m := STEP.search(line))]
    if run.returncode != 0 or len(steps) < 2:
        return None, (run.stderr or run.stdout)[-600:]
    return statistics.median(steps[1:]) / 1000.0, ""


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--ranks-per-node", type=int, default=0, help="default: --ranks (one host)")
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--hostfile", default="")
    p.add_argument("--launch-args", default="", help="with --hostfile: more `tessera launch` flags, a JSON list "
                   "(e.g. the emulated cluster's ssh config)")
    p.add_argument("--plan-args", default="", help="extra `tessera plan` flags (default: no offload, "
                   "checkpointing or context parallelism)")
    p.add_argument("--port", type=int, default=31500)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default="", help="write every layout's row here (JSON)")
    p.add_argument("--measured", action="append", default=[], help="an earlier sweep's --out of the same layouts: "
                   "averaged in (repeatable)")
    p.add_argument("--no-run", action="store_true", help="with --measured: run nothing, compare the present "
                   "predictions with those sweeps")
    args = p.parse_args()
    if args.no_run and not args.measured:
        sys.exit("--no-run compares with earlier sweeps: give --measured FILE")
    args.ranks_per_node = args.ranks_per_node or args.ranks
    answer = plan(args)
    rows = []
    # Under the checkout, not /tmp: the emulated hosts' ranks (ssh) do not see this machine's /tmp.
    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    earlier = []
    for path in args.measured:
        with open(path) as f:
            earlier.append({r["label"]: r["measured"] for r in json.load(f)["rows"]})
    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, "build"), prefix="planner-sweep-") as workdir:
        for i, cand in enumerate(answer["ranked"]):
            label = cand["layout"]["label"]
            seconds, error = None, "not run (--no-run)"
            if not args.no_run:
                print("[%d/%d] %s" % (i + 1, len(answer["ranked"]), label), file=sys.stderr, flush=True)
                seconds, error = measure(cand["config"], args, workdir, i)
                print("    %s" % ("%.3f s" % seconds if seconds is not None else "failed"), file=sys.stderr, flush=True)
            rows.append({"rank": cand["rank"], "label": label, "predicted": cand["step_seconds"],
                         "measured": seconds, "error": error, "terms": cand["terms"]})
    if args.out and not args.no_run:
        with open(args.out, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    # Every sweep's time of each layout (this one's first), and their mean.
    rounds = ([] if args.no_run else [{r["label"]: r["measured"] for r in rows}]) + earlier
    for r in rows:
        times = [sweep.get(r["label"]) for sweep in rounds]
        r["measured"] = statistics.mean(times) if times and None not in times else None
    ok = [r for r in rows if r["measured"] is not None]
    if not ok:
        sys.exit("no layout ran; the first error:\n" + rows[0]["error"])
    best = min(ok, key=lambda r: r["measured"])
    first = next(r for r in rows if r["measured"] is not None)
    top3 = [r for r in rows[:3] if r["measured"] is not None]
    summary = {
        "layouts": len(rows), "measured": len(ok), "failed": [r["label"] for r in rows if r["measured"] is None],
        "best_measured": best["label"], "best_seconds": best["measured"],
        "first_choice": rows[0]["label"], "first_choice_seconds": rows[0]["measured"],
        "first_choice_vs_best": (rows[0]["measured"] or float("nan")) / best["measured"],
        "best_of_top3_vs_best": min(r["measured"] for r in top3) / best["measured"],
        "spearman": spearman([r["predicted"] for r in ok], [r["measured"] for r in ok]),
        "calibration": answer["calibration"],
    }
    if len(rounds) > 1:
        both = [r["label"] for r in ok]
        summary["sweeps"] = len(rounds)
        summary["spearman_between_sweeps"] = [
            spearman([rounds[a][k] for k in both], [rounds[b][k] for k in both])
            for a in range(len(rounds)) for b in range(a + 1, len(rounds))]
    if first is not rows[0]:
        summary["note"] = "the first choice failed to run"
    print(json.dumps(summary))
    print("\n| # | layout | predicted (s) | measured (s) | measured / predicted |")
    print("|---|---|---|---|---|")
    for r in rows:
        m = "%.3f" % r["measured"] if r["measured"] is not None else "failed"
        ratio = "%.2f" % (r["measured"] / r["predicted"]) if r["measured"] is not None else ""
        print("| %d | %s | %.3f | %s | %s |" % (r["rank"], r["label"], r["predicted"], m, ratio))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
