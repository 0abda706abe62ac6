#!/usr/bin/env bash
# offload_optimizer.super_offload on CPU, as a stand-in for one GPU and its host: one rank, one
# thread (OMP_NUM_THREADS=1), so the forward and backward (the "GPU"'s work) run on one core while
# the speculated host step's thread can run on the other; the GPU ranks' host path through
# TESSERA_HOST_STAGING=1. The example GPT (bench/gpt_train.py), fp32 AdamW, ZeRO 1, no clipping
# (each speculation kept), interleaved rounds of:
#   in-place     the step without offload (the baseline)
#   offload      offload_optimizer cpu: the host step after the backward
#   super        the same with super_offload: each bucket's step during the backward
#   super-clip   super_offload with gradient_clipping far below the norm: every step restored and redone
# Prints each run's JSON line and, per variant, the median step time and its ratio to in-place.
#
#   bench/run_super_offload.sh [LAYERS=8] [EMBD=512] [MICRO=1] [STEPS=14] [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1:-8} embd=${2:-512} micro=${3:-1} steps=${4:-14} rounds=${5:-3}
python=$(scripts/setup.sh | tail -n 1)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() {  # NAME ARGS...
  local name=$1
  shift
  OMP_NUM_THREADS=1 TESSERA_HOST_STAGING=1 build/bin/tessera launch --nproc-per-node 1 -- \
    "$python" bench/gpt_train.py --impl tessera --stage 1 --layers "$layers" --embd "$embd" --heads 8 \
    --micro "$micro" --steps "$steps" --warmup 4 "$@" | tail -n 1 | tee -a "$out/$name.jsonl"
}
for round in $(seq "$rounds"); do
  run in-place --clip 0
  run offload --clip 0 --offload cpu
  run super --clip 0 --offload cpu --super-offload
  run super-clip --clip 1e-6 --offload cpu --super-offload
done
"$python" - "$out" <<'EOF'
import json, statistics, sys
rows = {n: [json.loads(l) for l in open("%s/%s.jsonl" % (sys.argv[1], n))]
        for n in ("in-place", "offload", "super", "super-clip")}
base = statistics.median(r["step_ms"] for r in rows["in-place"])
for name, runs in rows.items():
    ms = statistics.median(r["step_ms"] for r in runs)
    spec = runs[-1].get("speculation")
    print(json.dumps({"variant": name, "median_step_ms": ms, "vs_in_place": round(ms / base, 3),
                      "parameters": runs[-1]["parameters"], "speculation": spec,
                      "engine_ms": runs[-1].get("engine_time_per_step_ms")}))
EOF
