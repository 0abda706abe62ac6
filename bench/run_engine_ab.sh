#!/usr/bin/env bash
# Before and after a change to the engine's core: the same GPT training (examples/train_gpt, as
# bench/run_engine_vs_ddp.sh trains it: 2 ranks, Gloo, fp32 AdamW, clipping 1.0, MICRO × 128
# tokens per rank) from two builds, interleaved round by round (the order alternating), at ZeRO 0,
# 1, 2 and 3 and at ZeRO 2 with the optimizer offloaded to cpu and to nvme (a folder under TMPDIR).
#
#   bench/run_engine_ab.sh BUILD_BEFORE BUILD_AFTER [STEPS=50] [MICRO=8] [ROUNDS=3]
#
# Environment: RANKS (2), BUCKET (reduce_bucket_size and allgather_bucket_size, 5e6; "default":
# DeepSpeed's 5e8, the keys left out), CONFIGS (a subset of the names below, space-separated),
# MODEL ("--n-layer 12 --n-embd 768 --n-head 12 --seq-len 128": train_gpt's size flags; empty: its
# default).
#
# BUILD_*: build folders holding bin/tessera and bin/train_gpt (e.g. one made from the commit
# before: git worktree add /tmp/before COMMIT && BUILD_DIR=/tmp/before/build /tmp/before/scripts/build.sh
# train_gpt tessera_cli). Prints one JSON line per configuration: each build's median samples/s and
# the ratio after/before, each build's largest peak RSS per rank (median round) and their ratio, and
# whether the two builds' final parameters are byte for byte the same in every round (both write
# them with --save-parameters; the same arithmetic gives the same bytes).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,14p "$0" >&2; exit 2; }
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
steps=${3:-50}
micro=${4:-8}
rounds=${5:-3}
ranks=${RANKS:-2}
bucket=${BUCKET:-5e6}
buckets="\"reduce_bucket_size\": $bucket, \"allgather_bucket_size\": $bucket, "
[ "$bucket" = default ] && buckets=""
read -r -a model <<< "${MODEL:-}"
interval=$((steps / 5))
[ "$interval" -ge 1 ] || { echo "STEPS must be at least 5" >&2; exit 2; }
steps=$((interval * 5))
python=$(scripts/setup.sh | tail -n 1)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkdir -p "$out/nvme"

config() {  # NAME STAGE OFFLOAD
  local offload=""
  case "$3" in
    cpu) offload=', "offload_optimizer": {"device": "cpu"}' ;;
    nvme) offload=", \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"$out/nvme\"}" ;;
  esac
  cat > "$out/$1.json" <<EOF
{
  "train_micro_batch_size_per_gpu": $micro,
  "gradient_accumulation_steps": 1,
  "steps_per_print": $interval,
  "wall_clock_breakdown": true,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": $2, ${buckets}"overlap_comm": true,
                        "stage3_param_persistence_threshold": 0$offload}
}
EOF
}
names=(zero0 zero1 zero2 zero3 zero2-offload-cpu zero2-offload-nvme)
[ -n "${CONFIGS:-}" ] && read -r -a names <<< "$CONFIGS"
config zero0 0 none; config zero1 1 none; config zero2 2 none; config zero3 3 none
config zero2-offload-cpu 2 cpu; config zero2-offload-nvme 2 nvme

port=29870
for round in $(seq 1 "$rounds"); do
  for name in "${names[@]}"; do
    order=(before after)
    [ $((round % 2)) -eq 0 ] && order=(after before)
    for side in "${order[@]}"; do
      dir=$before
      [ "$side" = after ] && dir=$after
      echo "round $round/$rounds: $name ($side)" >&2
      "$dir/bin/tessera" launch --nproc-per-node "$ranks" --master-port $((port++)) -- "$dir/bin/train_gpt" \
        --config "$out/$name.json" --steps "$steps" --save-parameters "$out/$name.$side.$round.bin" "${model[@]}" \
        > "$out/$name.$side.$round.log"
    done
  done
done

"$python" - "$out" "$rounds" "${names[@]}" <<'PY'
import filecmp, json, re, statistics, sys
d, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
progress = re.compile(r"^step (\d+) \|.*\| ([\d.]+) samples/s \|", re.M)

def run(name, side, r):
    text = open(f"{d}/{name}.{side}.{r}.log").read()
    rates = [float(m[2]) for m in progress.finditer(text)][1:]  # the first interval is warm-up
    rss = [int(x) for x in re.search(r"peak rss per rank \(bytes\):((?: \d+)+)", text)[1].split()]
    return {"samples_per_s": statistics.fmean(rates), "peak_rss": max(rss),
            "final_loss": re.search(r"^final loss: (\S+)$", text, re.M)[1]}

for name in names:
    row = {"config": name}
    sides = {side: [run(name, side, r) for r in range(1, rounds + 1)] for side in ("before", "after")}
    for side, runs in sides.items():
        mid = sorted(runs, key=lambda x: x["samples_per_s"])[(len(runs) - 1) // 2]
        row[side] = {"samples_per_s": round(mid["samples_per_s"], 2), "peak_rss_max_bytes": mid["peak_rss"],
                     "rounds_samples_per_s": [round(x["samples_per_s"], 2) for x in runs],
                     "final_loss": mid["final_loss"]}
    row["speed_after_over_before"] = round(row["after"]["samples_per_s"] / row["before"]["samples_per_s"], 3)
    row["peak_rss_after_over_before"] = round(row["after"]["peak_rss_max_bytes"] / row["before"]["peak_rss_max_bytes"], 4)
    row["final_parameters_identical"] = all(
        filecmp.cmp(f"{d}/{name}.before.{r}.bin", f"{d}/{name}.after.{r}.bin", shallow=False) for r in range(1, rounds + 1))
    print(json.dumps(row), flush=True)
PY
