"""Draws a tessera metrics file (JSON Lines, tessera/monitor/jsonl.py) as a PNG: loss, learning rate and
throughput against the optimizer step; or, given a directory of csv_monitor's CSV files
(DeepSpeed's layout, Train_Samples_train_loss.csv ..., written by tessera or by DeepSpeed), the same
against the global sample count, with no TensorBoard needed.

    python python/tessera/plot.py runs/gpt/metrics.jsonl -o loss.png
    python -m tessera.plot runs/gpt/metrics.jsonl -o loss.png
    tessera plot runs/gpt/metrics.jsonl -o loss.png       (the CLI runs this file)
    tessera plot runs/gpt -o loss.png                     (the CSV files in that directory)

Needs only matplotlib (no torch, no tessera._C), so it runs as a plain script.
"""
import argparse
import json
import math
import os
import sys


# csv_monitor's tags (their files' last component) -> the JSONL record's keys.
_CSV_KEYS = {"train_loss": "loss", "lr": "lr", "samples_per_sec": "samples_per_s", "tokens_per_sec": "tokens_per_s"}


def read_csv_records(directory):
    """Records {"step": global samples, "loss", "lr", ...} from the Train_Samples_*.csv files."""
    by_step = {}
    for tag, key in _CSV_KEYS.items():
        path = os.path.join(directory, "Train_Samples_%s.csv" % tag)
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            for number, line in enumerate(f, 1):
                fields = line.strip().split(",")
                if len(fields) != 2 or fields[0] == "step":  # a header (a restarted run appends another)
                    continue
                try:
                    by_step.setdefault(int(fields[0]), {})[key] = float(fields[1])
                except ValueError:
                    raise ValueError("%s:%d: expected `step,value`" % (path, number)) from None
    if not by_step:
        raise ValueError("%s: no Train_Samples_*.csv files with rows (is csv_monitor enabled, and did a step finish?)"
                         % directory)
    return [dict(values, step=step) for step, values in sorted(by_step.items())]


def read_records(path):
    if os.path.isdir(path):
        return read_csv_records(path)
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError("%s:%d: not a JSON object (%s)" % (path, number, e)) from None
            if not isinstance(record, dict) or "step" not in record:
                raise ValueError("%s:%d: a record needs a \"step\"" % (path, number))
            records.append(record)
    if not records:
        raise ValueError("%s: no records (is csv_monitor enabled in the config, and did a step finish?)" % path)
    return records


def smooth(values, window):
    """Trailing mean over `window` values (NaNs skipped)."""
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        good = [a for a in acc if a is not None and not math.isnan(a)]
        out.append(sum(good) / len(good) if good else float("nan"))
    return out


def series(records, key):
    return [r.get(key, float("nan")) for r in records]


def plot(path, output, title=None):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_records(path)
    steps = series(records, "step")
    window = max(1, len(records) // 25)
    fig, axes = plt.subplots(3, 1, figsize=(8, 8.5), sharex=True, gridspec_kw={"height_ratios": [2.2, 1, 1]})

    ax = axes[0]
    loss = series(records, "loss")
    ax.plot(steps, loss, color="tab:blue", alpha=0.35, linewidth=1, label="loss")
    if window > 1:
        ax.plot(steps, smooth(loss, window), color="tab:blue", linewidth=2, label="loss (mean of %d steps)" % window)
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    last = next((v for v in reversed(loss) if v is not None and not math.isnan(v)), float("nan"))
    name = os.path.basename(os.path.abspath(path) if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)))
    ax.set_title(title or "%s — %d steps, last loss %.4f" % (name or path, len(records), last))

    ax = axes[1]
    ax.plot(steps, series(records, "lr"), color="tab:green", linewidth=1.5)
    ax.set_ylabel("learning rate")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    ax.grid(alpha=0.3)

    ax = axes[2]
    samples = series(records, "samples_per_s")
    ax.plot(steps, smooth(samples, window), color="tab:orange", linewidth=1.5, label="samples/s")
    ax.set_ylabel("samples/s")
    ax.set_xlabel("samples" if os.path.isdir(path) else "step")
    ax.grid(alpha=0.3)
    if any("tokens_per_s" in r for r in records):
        twin = ax.twinx()
        twin.plot(steps, smooth(series(records, "tokens_per_s"), window), color="tab:red", linewidth=1, alpha=0.6,
                  label="tokens/s")
        twin.set_ylabel("tokens/s")
        lines = ax.get_lines() + twin.get_lines()
        ax.legend(lines, [l.get_label() for l in lines], loc="lower right")
    if window > 1:
        ax.text(0.01, 0.04, "throughput: mean of %d steps" % window, transform=ax.transAxes, fontsize=8, alpha=0.7)

    fig.tight_layout()
    directory = os.path.dirname(output)
    if directory:
        os.makedirs(directory, exist_ok=True)
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return len(records)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tessera plot", description="Plot loss, learning rate and throughput "
                                 "against the step from a tessera metrics file (JSON Lines).")
    ap.add_argument("metrics", help="the metrics file, {output_path}/{job_name}/metrics.jsonl")
    ap.add_argument("-o", "--output", default=None, help="the PNG to write (default: loss.png next to the metrics file)")
    ap.add_argument("--title", default=None, help="the figure's title")
    args = ap.parse_args(argv)
    where = args.metrics if os.path.isdir(args.metrics) else os.path.dirname(args.metrics)
    output = args.output or os.path.join(where, "loss.png")
    try:
        n = plot(args.metrics, output, args.title)
    except (OSError, ValueError) as e:
        print("tessera plot: %s" % e, file=sys.stderr)
        return 1
    except ImportError as e:
        print("tessera plot: %s (install matplotlib: it is in scripts/requirements.txt)" % e, file=sys.stderr)
        return 1
    print("tessera plot: %d steps -> %s" % (n, output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
