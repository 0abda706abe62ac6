#!/usr/bin/env bash
# The 1-bit optimizers against Adam (issue 17's benchmark): the example GPT (bench/gpt_train.py,
# ~85M parameters by default) on 2 ranks × 1 thread over Gloo on loopback, fp32, ZeRO stage 0,
# clipping 1.0, the same data:
#   adam        AdamW with one gradient bucket: a single allreduce per step, issued when backward
#               ends, so its time in the Communicator's counters is the allreduce's own
#   onebit      OneBitAdam, freeze_step FREEZE
#   zeroone     ZeroOneAdam, var_freeze_step FREEZE (after it every step syncs: local_step_scaler
#               keeps the interval at 1 for this run's length)
# The first WARMUP steps (past the freeze) are not timed. Per timed step, from rank 0's data group
# (the Communicator's counters): bytes put on the wire (sent_bytes) and the time from each
# collective's call to its completion, summed; the ratios to Adam; samples/s. Medians of ROUNDS
# interleaved rounds. DeepSpeed's 1-bit Adam is not run: 0.19.8 removed it, and 0.19.6 fails on a
# CPU (docs/onebit.md).
#
#   bench/run_onebit_compare.sh [ROUNDS=3]     LAYERS=12 EMBD=768 HEADS=12 MICRO=2 STEPS=16 WARMUP=8 FREEZE=4
#
# CLUSTER_RATE=1gbit (root): the 2 ranks on two emulated hosts (scripts/cluster.sh) whose links are
# shaped to that rate, one rank each, instead of loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
layers=${LAYERS:-12} embd=${EMBD:-768} heads=${HEADS:-12} micro=${MICRO:-2} steps=${STEPS:-16}
warmup=${WARMUP:-8} freeze=${FREEZE:-4}
python=$(scripts/setup.sh | tail -n 1)
scripts/build.sh tessera_cli tessera_python >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
shape=(--impl tessera --stage 0 --layers "$layers" --embd "$embd" --heads "$heads" --micro "$micro" --steps "$steps"
       --warmup "$warmup" --freeze "$freeze")
port=29990
cluster=${CLUSTER_RATE:-}
if [ -n "$cluster" ]; then
  source bench/cluster_launch.sh
  scripts/cluster.sh up 2 "$cluster" >/dev/null
  trap 'scripts/cluster.sh down; rm -rf "$out"' EXIT
fi
for round in $(seq 1 "$rounds"); do
  for run in adam onebit zeroone; do
    case $run in
      adam) extra=(--bucket 1e9) ;;
      onebit) extra=(--optimizer OneBitAdam) ;;
      zeroone) extra=(--optimizer ZeroOneAdam) ;;
    esac
    echo "round $round/$rounds: $run" >&2
    if [ -n "$cluster" ]; then
      cluster_launch 2 $((port++)) "$out/$run.$round.log" "$out/$run.$round.err" "$python" bench/gpt_train.py \
        "${shape[@]}" "${extra[@]}" || { tail -n 20 "$out/$run.$round.err" >&2; exit 1; }
    else
      build/bin/tessera launch --nproc-per-node 2 --master-port $((port++)) -- "$python" bench/gpt_train.py \
        "${shape[@]}" "${extra[@]}" > "$out/$run.$round.log" 2> "$out/$run.$round.err" ||
        { tail -n 20 "$out/$run.$round.err" >&2; exit 1; }
    fi
  done
done

"$python" - "$out" "$rounds" <<'PY'
import json, sys
d, rounds = sys.argv[1], int(sys.argv[2])
def result(path):
    return next(json.loads(l) for l in open(path) if l.startswith("{"))
runs = {k: [result("%s/%s.%d.log" % (d, k, r)) for r in range(1, rounds + 1)] for k in ("adam", "onebit", "zeroone")}
def median(k, key):
    return sorted(r[key] for r in runs[k])[(rounds - 1) // 2]
adam_bytes, adam_ms = median("adam", "data_sent_bytes_per_step"), median("adam", "data_comm_ms_per_step")
print("%d parameters, %d ranks, micro-batch %d, %d timed steps; medians of %d rounds" % (
    runs["adam"][0]["parameters"], runs["adam"][0]["ranks"], runs["adam"][0]["micro_batch"], runs["adam"][0]["steps"], rounds))
print("| optimizer | phase | sent per step (rank 0) | vs Adam | communication per step | vs Adam | samples/s | vs Adam |")
print("|---|---|---|---|---|---|---|---|")
for k, name in (("adam", "AdamW"), ("onebit", "OneBitAdam"), ("zeroone", "ZeroOneAdam")):
    b, ms, sps = median(k, "data_sent_bytes_per_step"), median(k, "data_comm_ms_per_step"), median(k, "samples_per_s")
    print("| %s | %s | %.2f MB | 1/%.1f | %.1f ms | 1/%.1f | %.3f | %.2f |" % (
        name, runs[k][0].get("phase_at_end") or "-", b / 1e6, adam_bytes / b, ms, adam_ms / ms, sps,
        sps / median("adam", "samples_per_s")))
for k in runs:
    for r in runs[k]:
        print(json.dumps({key: r[key] for key in ("optimizer", "samples_per_s", "data_sent_bytes_per_step",
                                                  "data_comm_ms_per_step", "final_loss", "engine_time_per_step_ms")
                          if key in r} | {"run": k}))
PY
