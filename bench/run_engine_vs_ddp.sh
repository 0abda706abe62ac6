#!/usr/bin/env bash
# GPT training throughput: tessera's engine at ZeRO 0, 1 and 2 (examples/train_gpt) against
# PyTorch DistributedDataParallel (bench/gpt_train.py --impl ddp) in the same run, on the same model, data,
# batch and optimizer: 2 ranks under `tessera launch` (OMP_NUM_THREADS=1 each), Gloo, fp32, AdamW
# (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on dim >= 2, 0 on biases and LayerNorm),
# gradient clipping 1.0, constant learning rate, micro-batch MICRO × 128 tokens per rank.
#
#   bench/run_engine_vs_ddp.sh [STEPS=100] [MICRO=8] [ROUNDS=1]
#
# Each run trains STEPS steps (rounded down to a multiple of 5); the first STEPS/5 are warm-up, not
# timed (tessera: steps_per_print = STEPS/5 and the first progress interval is dropped; DDP:
# --warmup STEPS/5). With ROUNDS > 1 the four runs are interleaved round by round and each impl's
# median round (by samples/s) is reported.
# Prints one JSON line per impl: samples_per_s, step_ms, peak_rss_bytes per rank, the time split per
# step, final_loss (the two sides start from the same weights and see the same batches, so they
# agree closely), and ratio_vs_ddp = samples_per_s / DDP's.
#   REDUCE_BUCKET  tessera's reduce_bucket_size/allgather_bucket_size in elements (default 5e6)
#   DDP_BUCKET     "match" (default): DDP's bucket_cap_mb = REDUCE_BUCKET × 4 bytes, so both sides
#                  bucket alike (an explicit bucket_cap_mb also drops DDP's 1 MiB first bucket; at
#                  5e6 the whole 842,496-parameter model is one bucket on both sides and all gradient
#                  communication happens after backward); "default": DDP's own (25 MiB + a 1 MiB first
#                  bucket, which overlaps with backward)
#   KEEP_LOGS=1    keep the runs' logs (their folder is printed on stderr)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-100}
micro=${2:-8}
rounds=${3:-1}
bucket=${REDUCE_BUCKET:-5e6}
interval=$((steps / 5))
[ "$interval" -ge 1 ] || { echo "STEPS must be at least 5" >&2; exit 2; }
steps=$((interval * 5))
python=$(scripts/setup.sh | tail -n 1)
scripts/build.sh train_gpt tessera_cli >/dev/null
out=$(mktemp -d)
if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "logs: $out" >&2; else trap 'rm -rf "$out"' EXIT; fi

for stage in 0 1 2; do
  cat > "$out/zero$stage.json" <<EOF
{
  "train_micro_batch_size_per_gpu": $micro,
  "gradient_accumulation_steps": 1,
  "steps_per_print": $interval,
  "wall_clock_breakdown": true,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "gradient_clipping": 1.0,
  "bf16": {"enabled": false},
  "zero_optimization": {"stage": $stage, "reduce_bucket_size": $bucket, "allgather_bucket_size": $bucket, "overlap_comm": true}
}
EOF
done
case "${DDP_BUCKET:-match}" in
  match) ddp_bucket=(--bucket "$bucket") ;;
  default) ddp_bucket=(--ddp-default-bucket) ;;
  *) echo "DDP_BUCKET is match or default" >&2; exit 2 ;;
esac

port=29830
for round in $(seq 1 "$rounds"); do
  echo "round $round/$rounds: ddp" >&2
  build/bin/tessera launch --nproc-per-node 2 --master-port $((port++)) -- "$python" bench/gpt_train.py --impl ddp \
    --steps "$steps" --warmup "$interval" --micro "$micro" "${ddp_bucket[@]}" > "$out/ddp.$round.log"
  for stage in 0 1 2; do
    echo "round $round/$rounds: tessera ZeRO $stage" >&2
    build/bin/tessera launch --nproc-per-node 2 --master-port $((port++)) -- build/bin/train_gpt \
      --config "$out/zero$stage.json" --steps "$steps" > "$out/zero$stage.$round.log"
  done
done

"$python" - "$out" "$rounds" <<'PY'
import json, re, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
progress = re.compile(r"^step (\d+) \|.*\| ([\d.]+) samples/s \| (\d+) tokens/s \| step ([\d.]+) ms")
split = re.compile(r"forward\+data ([\d.]+) ms \| backward ([\d.]+) ms \| reduce wait ([\d.]+) ms \| "
                   r"optimizer ([\d.]+) ms \| allgather wait ([\d.]+) ms")

def tessera(path, stage):
    lines = open(path).read().splitlines()
    intervals, times = [], []
    for i, line in enumerate(lines):
        m = progress.match(line)
        if m:
            intervals.append((int(m[1]), float(m[4])))
            s = split.search(lines[i + 1]) if i + 1 < len(lines) else None
            times.append([float(x) for x in s.groups()] if s else None)
    header = next(l for l in lines if " steps of " in l)           # "N steps of B sequences (M per rank ..."
    global_batch = int(re.search(r"steps of (\d+) sequences", header)[1])
    micro = int(re.search(r"\((\d+) per rank", header)[1])
    # Drop the first interval (warm-up); the others are contiguous and equally long.
    timed, ttimed = intervals[1:], times[1:]
    per = timed[0][0] - intervals[0][0]
    step_ms = statistics.fmean(ms for _, ms in timed)
    rss = [int(x) for x in re.search(r"peak rss per rank \(bytes\):((?: \d+)+)", "\n".join(lines))[1].split()]
    keys = ("forward_data_ms", "backward_ms", "reduce_wait_ms", "optimizer_ms", "allgather_wait_ms")
    return {"impl": f"tessera-zero{stage}", "ranks": len(rss), "micro_batch": micro, "steps": per * len(timed),
            "warmup_steps": intervals[0][0],
            "samples_per_s": round(global_batch * 1000 / step_ms, 2),
            "tokens_per_s": round(global_batch * 128 * 1000 / step_ms, 1), "step_ms": round(step_ms, 2),
            "peak_rss_bytes": rss, "peak_rss_max_bytes": max(rss),
            "final_loss": float(re.search(r"final loss: ([\d.]+)", "\n".join(lines))[1]),
            "time_per_step_ms": {k: round(statistics.fmean(t[j] for t in ttimed), 2) for j, k in enumerate(keys)}}

def ddp(path):
    return next(json.loads(l) for l in open(path) if l.startswith("{"))

results = {}
for r in range(1, rounds + 1):
    results.setdefault("ddp", []).append(ddp(f"{d}/ddp.{r}.log"))
    for stage in range(3):
        results.setdefault(f"tessera-zero{stage}", []).append(tessera(f"{d}/zero{stage}.{r}.log", stage))

def median_round(runs):
    return sorted(runs, key=lambda x: x["samples_per_s"])[(len(runs) - 1) // 2]

base = median_round(results["ddp"])["samples_per_s"]
for impl, runs in results.items():
    row = dict(median_round(runs))
    row["ratio_vs_ddp"] = round(row["samples_per_s"] / base, 3)
    if rounds > 1:
        row["rounds_samples_per_s"] = [x["samples_per_s"] for x in runs]
    print(json.dumps(row))
PY
