#!/usr/bin/env bash
# Tensor parallelism against data parallelism on the same 2 ranks (issue 15's benchmark): the
# example GPT (bench/gpt_train.py) at the same global batch, fp32 AdamW, clipping 1.0,
# 2 ranks × 1 thread, Gloo:
#   dp2     data parallelism, ZeRO-1, micro MICRO per rank
#   tp2     tensor_parallel.tp_size 2 (tessera's automatic plan), micro 2·MICRO on the one replica
#   tp2sp   the same with sequence parallelism
# Medians of ROUNDS interleaved rounds: samples/s, peak RSS per rank, and the bytes rank 0 put into
# collectives per step by group (the Communicator's counters) against the theory:
#   tp, per step: 4 collectives per block of B·T·C·4 bytes (2 forward after the row-parallel
#   layers, 2 backward before the column-parallel ones); SP: the same as reduce-scatters and
#   all-gathers, plus the column-parallel layers' inputs gathered again in backward (2 per block:
#   they keep only their part of the sequence), the final norm's gather and its backward
#   (2·B·T·C·4), and the per-parameter gradient sums of the norms and row-parallel biases.
#   dp (ZeRO-1): a reduce-scatter and an all-gather of the whole fp32 model, 4Ψ bytes each.
#
#   bench/run_tp_compare.sh [ROUNDS=3]     LAYERS=12 EMBD=768 HEADS=12 MICRO=2 STEPS=14
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
layers=${LAYERS:-12} embd=${EMBD:-768} heads=${HEADS:-12} micro=${MICRO:-2} steps=${STEPS:-14}
python=$(scripts/setup.sh | tail -n 1)
scripts/build.sh tessera_cli tessera_python >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
shape=(--layers "$layers" --embd "$embd" --heads "$heads" --steps "$steps" --warmup $((steps / 3)) --bucket 2.5e5 --stage 1)
port=29970
for round in $(seq 1 "$rounds"); do
  for layout in dp2 tp2 tp2sp; do
    case $layout in
      dp2) extra=(--micro "$micro") ;;
      tp2) extra=(--micro $((2 * micro)) --tp 2) ;;
      tp2sp) extra=(--micro $((2 * micro)) --tp 2 --sp) ;;
    esac
    echo "round $round/$rounds: $layout" >&2
    build/bin/tessera launch --nproc-per-node 2 --master-port $((port++)) -- "$python" bench/gpt_train.py \
      --impl tessera "${shape[@]}" "${extra[@]}" > "$out/$layout.$round.log" 2> "$out/$layout.$round.err" ||
      { tail -n 20 "$out/$layout.$round.err" >&2; exit 1; }
  done
done

"$python" - "$out" "$rounds" "$layers" "$embd" "$micro" <<'PY'
import json, sys
d, rounds, layers, embd, micro = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
SEQ = 128
def result(path):
    return next(json.loads(l) for l in open(path) if l.startswith("{"))
runs = {k: [result("%s/%s.%d.log" % (d, k, r)) for r in range(1, rounds + 1)] for k in ("dp2", "tp2", "tp2sp")}
med = {k: sorted(v, key=lambda x: x["samples_per_s"])[(rounds - 1) // 2] for k, v in runs.items()}
activation = 2 * micro * SEQ * embd * 4  # the tp replica's micro-batch: B·T·C fp32 bytes
theory = {"dp2": 2 * 4 * med["dp2"]["parameters"], "tp2": 4 * layers * activation,
          "tp2sp": 4 * layers * activation * 2 + 2 * layers * activation + 2 * activation}
print("| layout | samples/s | vs dp2 | peak RSS (MiB, max rank) | bytes/step (rank 0) | theory (excl. small sums) | rounds |")
print("|---|---|---|---|---|---|---|")
for k in ("dp2", "tp2", "tp2sp"):
    m = med[k]
    sent = sum(sum(g.values()) for g in m["comm_bytes_per_step"].values())
    print("| %s | %.3f | %.2f | %d | %.1f MB | %.1f MB | %s |" % (
        k, m["samples_per_s"], m["samples_per_s"] / med["dp2"]["samples_per_s"], m["peak_rss_max_bytes"] // 2**20,
        sent / 1e6, theory[k] / 1e6, " ".join("%.3f" % x["samples_per_s"] for x in runs[k])))
PY
