#!/usr/bin/env bash
# ZeRO 1 and 2 against PyTorch DDP and DeepSpeed: the example GPT (examples/python/models.py)
# through bench/gpt_train.py on 2 ranks × 1 thread under `tessera launch`, Gloo, fp32, AdamW,
# clipping 1.0, the same weights, batches and bucket size everywhere:
#   PyTorch DDP, tessera ZeRO 0/1/2 (Python API, overlap_comm), DeepSpeed ZeRO 1/2 (the pinned
#   version from PyPI, its CPU accelerator, in the venv bench/setup_deepspeed.sh makes)
#
#   bench/run_gpt_compare.sh [ROUNDS=3] [SIZES="small large"]
#
#   small  6 layers × 256 (4 heads), micro 8 × 128 tokens: 4.8M parameters, STEPS_SMALL=60 (15 warm-up)
#   large  12 layers × 768 (12 heads), micro 2 × 128 tokens: 85M parameters, STEPS_LARGE=24 (6 warm-up)
# Rounds are interleaved (every implementation once per round, in the same order) and each
# implementation's median round by samples/s is reported; peak RSS is each round's largest rank,
# median over the rounds (glibc's heap grows by a few tens of MiB differently from run to run).
# Prints one JSON line per size and implementation (ratio_vs_ddp, ratio_vs_deepspeed for the same
# stage, rss_saving_vs_previous_stage against the theory: 4Ψ bytes from stage 0 to 1 and 2Ψ from 1
# to 2 for fp32 Adam on 2 ranks), then a Markdown table per size.
#   REDUCE_BUCKET  reduce/allgather bucket in elements (default 2.5e5; DDP's bucket_cap_mb alike)
#   IMPLS          the implementations, e.g. "tessera:2 tessera:3 deepspeed:3 fsdp2" (default: ddp,
#                  tessera:0/1/2, deepspeed:1/2; every stage listed needs the one before it for
#                  the RSS saving, and deepspeed:S for the ratio to DeepSpeed)
#   ZeRO-3 runs (tessera:3, deepspeed:3) set stage3_max_live_parameters, _max_reuse_distance and
#   _prefetch_bucket_size to two whole blocks (a block is 0.79M elements small, 7.08M large: 1.6e6
#   and 1.5e7; LIVE_SMALL, LIVE_LARGE), for both: DeepSpeed's defaults (1e9) release nothing in
#   models this size. (1.4e7, used before, is just under two large blocks: the next block could
#   not be prefetched whole, and tessera waited 155 ms a step for gathers instead of 20–90.)
#   KEEP_LOGS=1    keep the runs' logs (their folder is printed on stderr)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
sizes=${2:-small large}
bucket=${REDUCE_BUCKET:-2.5e5}
python=$(scripts/setup.sh | tail -n 1)
ds_python=$(bench/setup_deepspeed.sh | tail -n 1)
scripts/build.sh tessera_cli tessera_python >/dev/null
out=$(mktemp -d)
if [ "${KEEP_LOGS:-0}" = 1 ]; then echo "logs: $out" >&2; else trap 'rm -rf "$out"' EXIT; fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
# DeepSpeed on a machine without a GPU: its CPU accelerator (it would look for CUDA otherwise).
export DS_ACCELERATOR=cpu

read -r -a impls <<< "${IMPLS:-ddp tessera:0 tessera:1 tessera:2 deepspeed:1 deepspeed:2}"
port=29930
for size in $sizes; do
  case $size in
    small) shape=(--layers 6 --embd 256 --heads 4 --micro 8 --live "${LIVE_SMALL:-1.6e6}"); steps=${STEPS_SMALL:-60}; warmup=$((steps / 4)) ;;
    large) shape=(--layers 12 --embd 768 --heads 12 --micro 2 --live "${LIVE_LARGE:-1.5e7}"); steps=${STEPS_LARGE:-24}; warmup=$((steps / 4)) ;;
    *) echo "unknown size $size (small, large)" >&2; exit 2 ;;
  esac
  for round in $(seq 1 "$rounds"); do
    for impl in "${impls[@]}"; do
      name=${impl%%:*} stage=0 tag=$name
      [ "$name" != ddp ] && [ "$name" != fsdp2 ] && stage=${impl#*:} tag=$name$stage
      py=$python; [ "$name" = deepspeed ] && py=$ds_python
      log="$out/$size.$tag.$round.log"
      echo "$size round $round/$rounds: $tag" >&2
      build/bin/tessera launch --nproc-per-node 2 --master-port $((port++)) -- "$py" bench/gpt_train.py \
        --impl "$name" --stage "$stage" "${shape[@]}" --steps "$steps" --warmup "$warmup" --bucket "$bucket" \
        > "$log" 2> "$log.err" || { echo "failed: $log.err" >&2; tail -n 20 "$log.err" >&2; exit 1; }
    done
  done
done

"$python" - "$out" "$rounds" "$sizes" "${impls[*]}" <<'PY'
import json, statistics, sys
d, rounds, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
names = [i.replace(":", "") for i in sys.argv[4].split()]
MiB = 2**20

def result(path):
    return next(json.loads(l) for l in open(path) if l.startswith("{"))

for size in sizes:
    runs = {n: [result(f"{d}/{size}.{n}.{r}.log") for r in range(1, rounds + 1)] for n in names}
    med = {n: sorted(rs, key=lambda x: x["samples_per_s"])[(len(rs) - 1) // 2] for n, rs in runs.items()}
    rss = {n: statistics.median_low([x["peak_rss_max_bytes"] for x in rs]) for n, rs in runs.items()}
    psi = med[names[0]]["parameters"]
    # Bytes saved per rank from the stage before (fp32 Adam, 2 ranks): optimizer states 4Ψ, then
    # gradients 2Ψ, then parameters 2Ψ.
    theory = {1: 4 * psi, 2: 2 * psi, 3: 2 * psi}
    base = med["ddp"]["samples_per_s"] if "ddp" in med else None
    rows = []
    for n in names:
        row = dict(med[n], size=size, rounds_samples_per_s=[x["samples_per_s"] for x in runs[n]],
                   rounds_peak_rss_max_bytes=[x["peak_rss_max_bytes"] for x in runs[n]], median_peak_rss_bytes=rss[n])
        if base:
            row["ratio_vs_ddp"] = round(row["samples_per_s"] / base, 3)
        if n.startswith("tessera") and n != "tessera0":
            stage = int(n[-1])
            if stage == 3 and "fsdp2" in med:
                row["ratio_vs_fsdp2"] = round(row["samples_per_s"] / med["fsdp2"]["samples_per_s"], 3)
            if f"deepspeed{stage}" in med:
                row["ratio_vs_deepspeed"] = round(row["samples_per_s"] / med[f"deepspeed{stage}"]["samples_per_s"], 3)
            if f"tessera{stage - 1}" in med:
                row["ratio_vs_previous_stage"] = round(row["samples_per_s"] / med[f"tessera{stage - 1}"]["samples_per_s"], 3)
                saved = rss[f"tessera{stage - 1}"] - rss[n]
                row["rss_saving_vs_previous_stage"] = round(saved / theory[stage], 3)
        rows.append(row)
        print(json.dumps(row))
    print(f"\n{size}: {psi / 1e6:.1f}M parameters, micro {med[names[0]]['micro_batch']} × 128, 2 ranks, "
          f"medians of {rounds} rounds\n")
    print("| implementation | samples/s | vs DDP | vs DeepSpeed | vs FSDP2 | vs stage before | peak RSS, largest rank (MiB) | "
          "saving vs stage before / theory | forward | backward | step | samples/s by round |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda row, key: "%.2f" % row[key] if key in row else ""  # noqa: E731
    for row in rows:
        t = row["time_per_step_ms"]
        print("| %s | %.2f | %s | %s | %s | %s | %s | %s | %.1f | %.1f | %.1f | %s |" % (
            row["impl"], row["samples_per_s"], fmt(row, "ratio_vs_ddp"), fmt(row, "ratio_vs_deepspeed"),
            fmt(row, "ratio_vs_fsdp2"), fmt(row, "ratio_vs_previous_stage"),
            "%d (%s)" % (row["median_peak_rss_bytes"] / MiB, " ".join("%d" % (b / MiB) for b in row["rounds_peak_rss_max_bytes"])),
            "%.2f" % row["rss_saving_vs_previous_stage"] if "rss_saving_vs_previous_stage" in row else "",
            t["forward_ms"], t["backward_ms"], t["step_ms"], " ".join("%.2f" % s for s in row["rounds_samples_per_s"])))
    print("\ntessera's own split (ms per step on rank 0):\n")
    print("| implementation | forward | backward | reduce wait | optimizer | allgather wait |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        if "engine_time_per_step_ms" in row:
            e = row["engine_time_per_step_ms"]
            print("| %s | %.1f | %.1f | %.1f | %.1f | %.1f |" % (row["impl"], e["forward_ms"], e["backward_ms"],
                  e["reduce_wait_ms"], e["optimizer_ms"], e["allgather_wait_ms"]))
    print()
PY
