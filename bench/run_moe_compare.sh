#!/usr/bin/env bash
# MoE with expert parallelism against the dense GPT and against DeepSpeed's MoE (issue 43's
# benchmark), 4 ranks × 1 thread, Gloo, fp32 AdamW, ZeRO-1 (bench/moe_train.py):
#   dense       the example GPT, LAYERS × EMBD (the same active MLP parameters per token)
#   tessera     every other block's MLP an MoE layer: EXPERTS experts of hidden 4·EMBD/2, top-2,
#               capacity factor 1.0, ep EP (tessera.moe.MoE)
#   deepspeed   the same model with deepspeed.moe.layer.MoE (DeepSpeed 0.19.8, its CPU accelerator)
# Medians of ROUNDS interleaved rounds: samples/s and the ratios, peak RSS per rank, tessera's
# all-to-all per step (calls, bytes against the formula: the kept rows sent and received each way,
# forward and backward, times H · 4, and E counts of 8 bytes per MoE layer; its share of the step) and each rank's expert and dense optimizer state from the engine's buffers.
#
#   bench/run_moe_compare.sh [ROUNDS=3]     LAYERS=4 EMBD=256 EXPERTS=8 EP=2 MICRO=4 STEPS=30
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
layers=${LAYERS:-4} embd=${EMBD:-256} experts=${EXPERTS:-8} ep=${EP:-2} micro=${MICRO:-4} steps=${STEPS:-30}
python=$(scripts/setup.sh | tail -n 1)
ds_python=$(bench/setup_deepspeed.sh | tail -n 1)
scripts/build.sh tessera_cli tessera_python >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--layers "$layers" --embd "$embd" --micro "$micro" --steps "$steps" --warmup $((steps / 3)) --ep "$ep")
port=29870
for round in $(seq 1 "$rounds"); do
  for run in dense tessera deepspeed; do
    case $run in
      dense) cmd=("$python" bench/moe_train.py --impl tessera --experts 0) ;;
      tessera) cmd=("$python" bench/moe_train.py --impl tessera --experts "$experts") ;;
      deepspeed) cmd=(env DS_ACCELERATOR=cpu "$ds_python" bench/moe_train.py --impl deepspeed --experts "$experts") ;;
    esac
    echo "round $round/$rounds: $run" >&2
    build/bin/tessera launch --nproc-per-node 4 --master-port $((port++)) -- "${cmd[@]}" "${common[@]}" \
      > "$out/$run.$round.log" 2> "$out/$run.$round.err" || { tail -n 30 "$out/$run.$round.err" >&2; exit 1; }
  done
done

"$python" - "$out" "$rounds" <<'PY'
import json, sys
d, rounds = sys.argv[1], int(sys.argv[2])
def result(path):
    return next(json.loads(l) for l in open(path) if l.startswith("{"))
runs = {k: [result("%s/%s.%d.log" % (d, k, r)) for r in range(1, rounds + 1)] for k in ("dense", "tessera", "deepspeed")}
med = {k: sorted(v, key=lambda x: x["samples_per_s"])[(rounds - 1) // 2] for k, v in runs.items()}
print("| run | samples/s | vs dense | vs DeepSpeed MoE | peak RSS per rank (MiB) | parameters on rank 0 | final loss |")
print("|---|---|---|---|---|---|---|")
for k in ("dense", "tessera", "deepspeed"):
    m = med[k]
    print("| %s | %.2f | %.2f | %.2f | %s | %d | %.4f |" % (
        k, m["samples_per_s"], m["samples_per_s"] / med["dense"]["samples_per_s"],
        m["samples_per_s"] / med["deepspeed"]["samples_per_s"], " ".join(str(b >> 20) for b in m["peak_rss_bytes"]),
        m["parameters_this_rank"], m["final_loss"]))
t = med["tessera"]
a = t.get("all_to_all")
if a:
    print("\ntessera's all-to-all on the expert-parallel group, per step: %.0f calls, %.2f MB (formula %.2f MB: the "
          "kept rows and the per-expert counts), %.1f ms = %.1f%% of the step" % (
              a["calls_per_step"], a["bytes_per_step"] / 1e6, t["all_to_all_formula_bytes"] / 1e6,
              1e3 * a["seconds_per_step"], 100 * a["share_of_step"]))
print("\ntessera's optimizer state on rank 0 by group (engine buffers):")
for g in t["groups"]:
    print("  %-40s over %-16s (%d ranks): %d of %d elements, state %.2f MB" % (
        g["first_parameter"][:40], g["communicator"], g["ranks"], g["shard_numel"], g["numel"], g["state_bytes"] / 1e6))
print("\nrounds: %d; each row the median round by samples/s" % rounds)
PY
