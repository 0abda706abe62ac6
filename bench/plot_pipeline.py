"""Draws a pipeline timeline (train_gpt --timeline FILE with pipeline.stages > 1): one row per
stage, its forwards and backwards as bars labelled with the micro-batch, receives as thin bars
(the time a stage waited for its neighbour). Needs only matplotlib.

    python bench/plot_pipeline.py timeline.jsonl [-o timeline.png]
"""
import argparse
import json

COLORS = {"Forward": "#4c72b0", "Backward": "#dd8452"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("timeline")
    parser.add_argument("-o", "--output", default=None, help="PNG to write (default: the timeline's name + .png)")
    args = parser.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(args.timeline) if line.strip()]
    stages = 1 + max(r["stage"] for r in rows)
    end = max(r["end"] for r in rows)
    fig, ax = plt.subplots(figsize=(12, 0.7 * stages + 1.2))
    for r in rows:
        y = stages - 1 - r["stage"]
        width = r["end"] - r["start"]
        if r["op"] in COLORS:
            ax.broken_barh([(r["start"], width)], (y - 0.35, 0.7), color=COLORS[r["op"]])
            if width > end / 150:
                ax.text(r["start"] + width / 2, y, str(r["micro_batch"]), ha="center", va="center", color="white",
                        fontsize=7)
        elif r["op"].startswith("Recv") and width > 0:
            ax.broken_barh([(r["start"], width)], (y - 0.08, 0.16), color="#999999")
    busy = {s: sum(r["end"] - r["start"] for r in rows if r["stage"] == s and r["op"] in COLORS) for s in range(stages)}
    ax.set_yticks(range(stages))
    ax.set_yticklabels(["stage %d (idle %.0f%%)" % (s, 100 * (1 - busy[s] / end)) for s in reversed(range(stages))])
    ax.set_xlabel("seconds since the batch began (blue: forward, orange: backward, grey: waiting to receive)")
    ax.set_xlim(0, end)
    fig.tight_layout()
    out = args.output or args.timeline.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=120)
    print("wrote %s" % out)


if __name__ == "__main__":
    main()
