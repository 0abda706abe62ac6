#!/usr/bin/env bash
# Pipeline parallelism against data parallelism on the same 2 ranks (issue 16's benchmark): the C++
# example GPT (build/bin/train_gpt) at ~85M parameters (12 × 768, 12 heads, block 128), fp32 AdamW,
# the same global batch of 4·MICRO sequences a step, 2 ranks × 1 thread, Gloo:
#   dp2        data parallelism, ZeRO-1, MICRO per rank, 2 accumulation steps
#   pp2-1f1b   pipeline.stages 2 by 1F1B, MICRO per micro-batch, 4 micro-batches
#   pp2-gpipe  the same by GPipe
# Medians of ROUNDS interleaved rounds: samples/s (from the progress line's mean step time over the
# last STEPS/2 steps),
# peak RSS per rank, and for the pipelines each stage's idle fraction and activations held in the
# last batch beside the simulator's (equal stage costs). With TIMELINE=DIR the last round's
# pipelines leave their timelines there as JSON lines and PNGs (bench/plot_pipeline.py).
#
#   bench/run_pp_compare.sh [ROUNDS=3]     LAYERS=12 EMBD=768 HEADS=12 MICRO=2 STEPS=8
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
layers=${LAYERS:-12} embd=${EMBD:-768} heads=${HEADS:-12} micro=${MICRO:-2} steps=${STEPS:-8}
python=$(scripts/setup.sh | tail -n 1)
scripts/build.sh train_gpt tessera_cli >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
config() {  # accumulation, extra sections
  echo "{\"train_micro_batch_size_per_gpu\": $micro, \"gradient_accumulation_steps\": $1, \"steps_per_print\": $((steps / 2)),
         \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4, \"weight_decay\": 0.1}}, \"gradient_clipping\": 1.0,
         \"zero_optimization\": {\"stage\": 1} $2}"
}
port=29870
for round in $(seq 1 "$rounds"); do
  for layout in dp2 pp2-1f1b pp2-gpipe; do
    case $layout in
      dp2) cfg=$(config 2 "") ;;
      pp2-1f1b) cfg=$(config 4 ', "pipeline": {"stages": 2, "schedule": "1f1b"}') ;;
      pp2-gpipe) cfg=$(config 4 ', "pipeline": {"stages": 2, "schedule": "gpipe"}') ;;
    esac
    extra=()
    if [[ -n "${TIMELINE:-}" && $round == "$rounds" && $layout != dp2 ]]; then
      mkdir -p "$TIMELINE"
      extra=(--timeline "$TIMELINE/$layout.jsonl")
    fi
    echo "round $round/$rounds: $layout" >&2
    build/bin/tessera launch --nproc-per-node 2 --master-port $((port++)) -- build/bin/train_gpt --config "$cfg" \
      --steps "$steps" --n-layer "$layers" --n-embd "$embd" --n-head "$heads" "${extra[@]}" > "$out/$layout.$round.log" 2>&1 ||
      { tail -n 20 "$out/$layout.$round.log" >&2; exit 1; }
    if [[ ${#extra[@]} -gt 0 ]]; then "$python" bench/plot_pipeline.py "$TIMELINE/$layout.jsonl" >&2; fi
  done
done

"$python" - "$out" "$rounds" "$micro" <<'PY'
import re, sys
d, rounds = sys.argv[1], int(sys.argv[2])
layouts = ("dp2", "pp2-1f1b", "pp2-gpipe")
batch = 4 * int(sys.argv[3])  # sequences a step, every layout
def parse(path):
    text = open(path).read()
    # the last progress line's mean step time (its samples/s has one decimal)
    r = {"samples_per_s": batch / (float(re.findall(r"\| step ([0-9.]+) ms", text)[-1]) / 1000)}
    m = re.search(r"peak rss per rank \(bytes\): ([0-9 ]+)", text)
    if m:
        r["rss"] = [int(x) / 2**20 for x in m.group(1).split()]
    stages = re.findall(r"pipeline stage (\d+): held (\d+) micro-batches \(simulated (\d+)\); idle ([0-9.]+) of the last "
                        r"batch's ([0-9.]+) s \(simulated with the batch's measured costs: ([0-9.]+)\); peak rss (\d+) MiB", text)
    if stages:
        r["rss"] = [float(s[6]) for s in stages]
        r["stages"] = ["held %s (sim %s), idle %s (sim %s)" % (s[1], s[2], s[3], s[5]) for s in stages]
    return r
runs = {k: [parse("%s/%s.%d.log" % (d, k, i)) for i in range(1, rounds + 1)] for k in layouts}
med = {k: sorted(v, key=lambda x: x["samples_per_s"])[(rounds - 1) // 2] for k, v in runs.items()}
base = med["dp2"]["samples_per_s"]
print("| layout | samples/s | vs dp 2 | peak RSS per rank (MiB) | last batch per stage: activations held, idle fraction (simulator) | samples/s by round |")
print("|---|---|---|---|---|---|")
for k in layouts:
    m = med[k]
    print("| %s | %.3f | %.2f | %s | %s | %s |" % (k, m["samples_per_s"], m["samples_per_s"] / base,
          " / ".join("%.0f" % x for x in m["rss"]), "; ".join(m.get("stages", ["-"])),
          " ".join("%.3f" % r["samples_per_s"] for r in runs[k])))
PY
