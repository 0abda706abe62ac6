#!/usr/bin/env bash
# Pipeline schedules against each other and against DeepSpeed's pipeline engine (issue 45's
# benchmark), bench/pipe_train.py: the example GPT at ~85M parameters (12 × 768, 12 heads, block
# 128) as one layer list both engines take, fp32 AdamW, 8 micro-batches of MICRO sequences a step,
# 1 thread per rank, Gloo.
#   p4-gpipe, p4-1f1b, p4-interleaved (v 3: the 12 blocks in 12 chunks), p4-zb_h1, p4-zb_v (8
#   chunks in a V: LAYERS=16, or 12 blocks fail to divide), p4-interleaved-v2 (8 chunks: LAYERS=16)
#                                                        tessera.pipe on 4 ranks, pp 4, ZeRO-1
#   p4-deepspeed                                         DeepSpeed 0.19.8's PipelineEngine (1F1B), ZeRO-1
#   p2-1f1b, p2-gpipe, p2-interleaved (v 2), p2-zb_h1, p2-zb_v, p2-deepspeed
#                                                        the same on 2 ranks, pp 2 (one core per rank)
#   pp2dp2-z1, pp2dp2-z3, pp2dp2-z3-micro                pp 2 x dp 2: ZeRO-1, ZeRO-3 gathered per
#                                                        batch, ZeRO-3 gathered per micro-batch
# Medians of ROUNDS interleaved rounds: samples/s, the ratios to tessera's 1F1B and DeepSpeed's at
# the same pp, peak RSS per rank, and each stage's idle fraction in the last batch (over the stages'
# shared span on the host's clock, the simulator's definition: measured_costs.h measured_idle) beside the
# simulator's: the schedule timed with the costs read off that batch (each stage's chunks' F, B and
# W, the transfers' measured latency, the loads and step), the idle to expect with those costs'
# spread (measured_costs.h expected_idle), the batch replayed with each instruction's own cost, and
# the balanced model's (the stages' mean costs on every stage, sends free).
#
#   bench/run_pp_schedules.sh [ROUNDS=2]     LAYERS=12 EMBD=768 HEADS=12 MICRO=1 STEPS=6
#                                            RUNS="p2-1f1b p2-zb_v ..." (default: all but p4-zb_v)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
layers=${LAYERS:-12} embd=${EMBD:-768} heads=${HEADS:-12} micro=${MICRO:-1} steps=${STEPS:-6}
python=$(scripts/setup.sh | tail -n 1)
ds_python=$(bench/setup_deepspeed.sh | tail -n 1)
scripts/build.sh tessera_cli tessera_python >/dev/null
# Every run's log stays in OUT (default a fresh temporary folder, named at the end).
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
common=(--layers "$layers" --embd "$embd" --heads "$heads" --micro "$micro" --micro-batches 8 --steps "$steps"
        --warmup $((steps / 3)))
runs=(p4-gpipe p4-1f1b p4-interleaved p4-zb_h1 p4-deepspeed p2-1f1b p2-interleaved p2-zb_h1 p2-zb_v p2-deepspeed
      pp2dp2-z1 pp2dp2-z3 pp2dp2-z3-micro)
if [ -n "${RUNS:-}" ]; then read -r -a runs <<< "$RUNS"; fi
port=29870
for round in $(seq 1 "$rounds"); do
  for run in "${runs[@]}"; do
    tessera=("$python" bench/pipe_train.py --impl tessera)
    deepspeed=(env DS_ACCELERATOR=cpu "$ds_python" bench/pipe_train.py --impl deepspeed)
    case $run in
      p4-gpipe) ranks=4 cmd=("${tessera[@]}" --stages 4 --schedule gpipe) ;;
      p4-1f1b) ranks=4 cmd=("${tessera[@]}" --stages 4 --schedule 1f1b) ;;
      p4-interleaved) ranks=4 cmd=("${tessera[@]}" --stages 4 --schedule interleaved_1f1b --virtual 3) ;;
      p4-interleaved-v2) ranks=4 cmd=("${tessera[@]}" --stages 4 --schedule interleaved_1f1b --virtual 2) ;;
      p4-zb_h1) ranks=4 cmd=("${tessera[@]}" --stages 4 --schedule zb_h1) ;;
      p4-zb_v) ranks=4 cmd=("${tessera[@]}" --stages 4 --schedule zb_v --virtual 2) ;;
      p4-deepspeed) ranks=4 cmd=("${deepspeed[@]}" --stages 4) ;;
      p2-1f1b) ranks=2 cmd=("${tessera[@]}" --stages 2 --schedule 1f1b) ;;
      p2-gpipe) ranks=2 cmd=("${tessera[@]}" --stages 2 --schedule gpipe) ;;
      p2-interleaved) ranks=2 cmd=("${tessera[@]}" --stages 2 --schedule interleaved_1f1b --virtual 2) ;;
      p2-zb_h1) ranks=2 cmd=("${tessera[@]}" --stages 2 --schedule zb_h1) ;;
      p2-zb_v) ranks=2 cmd=("${tessera[@]}" --stages 2 --schedule zb_v --virtual 2) ;;
      p2-deepspeed) ranks=2 cmd=("${deepspeed[@]}" --stages 2) ;;
      pp2dp2-z1) ranks=4 cmd=("${tessera[@]}" --stages 2 --schedule 1f1b --stage 1) ;;
      pp2dp2-z3) ranks=4 cmd=("${tessera[@]}" --stages 2 --schedule 1f1b --stage 3) ;;
      pp2dp2-z3-micro) ranks=4 cmd=("${tessera[@]}" --stages 2 --schedule 1f1b --stage 3 --zero3-gather micro_batch) ;;
      *) echo "unknown run: $run" >&2; exit 2 ;;
    esac
    echo "round $round/$rounds: $run" >&2
    # A rank that dies after the result is printed (DeepSpeed 0.19.8 over Gloo sometimes aborts in its
    # teardown: "terminate called without an active exception") keeps the result, with a warning.
    if ! build/bin/tessera launch --nproc-per-node "$ranks" --master-port $((port++)) -- "${cmd[@]}" "${common[@]}" \
      > "$out/$run.$round.log" 2> "$out/$run.$round.err"; then
      grep -q '^{' "$out/$run.$round.log" || { tail -n 30 "$out/$run.$round.err" >&2; exit 1; }
      echo "warning: $run round $round exited with an error after printing its result" >&2
    fi
  done
done

"$python" - "$out" "$rounds" "${runs[@]}" <<'PY'
import json, sys
d, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def result(path):
    return next(json.loads(l) for l in open(path) if l.startswith("{"))
runs = {k: [result("%s/%s.%d.log" % (d, k, r)) for r in range(1, rounds + 1)] for k in names}
med = {k: sorted(v, key=lambda x: x["samples_per_s"])[(rounds - 1) // 2] for k, v in runs.items()}
print("| run | samples/s | vs tessera 1F1B | vs DeepSpeed | peak RSS per rank (MiB) | send latency (ms, transfers timed); receive, posting a send per stage (ms) | last batch per stage: idle (simulated; expected [10th, 90th percentile]; replayed; balanced), held (simulated) | samples/s by round | final loss |")
print("|---|---|---|---|---|---|---|---|---|")
for k in names:
    m = med[k]
    pp = k.split("-")[0]
    one = med.get(pp + "-1f1b") or med.get("pp2dp2-z1")
    ds = med.get(pp + "-deepspeed")
    stages = "; ".join("%d: %.3f (%.3f; %.3f [%.3f, %.3f]; %.3f; %.3f), %d (%d)" % (
                           s["stage"], s["idle_on_shared_span"], s["simulated_idle"], s["expected_idle"], *s["expected_idle_range"],
                           s["replayed_idle"], s["simulated_idle_balanced"], s["held"], s["simulated_held"])
                       for s in m.get("stages_last_batch", []))
    costs = m.get("simulator_costs_s")
    print("| %s | %.3f | %s | %s | %s | %s | %s | %s | %.4f |" % (
        k, m["samples_per_s"], "%.2f" % (m["samples_per_s"] / one["samples_per_s"]) if one else "-",
        "%.2f" % (m["samples_per_s"] / ds["samples_per_s"]) if ds else "-",
        " ".join(str(b >> 20) for b in m["peak_rss_bytes"]),
        "%.1f (%d); receive %s; posting %s" % (1e3 * costs["send"], costs["timed_transfers"],
                                               "/".join("%.1f" % (1e3 * r) for r in costs["receive"]),
                                               "/".join("%.1f" % (1e3 * r) for r in costs["posting"]))
        if costs else "-", stages or "-",
        " ".join("%.3f" % r["samples_per_s"] for r in runs[k]), m["final_loss"]))
PY
echo "logs: $out" >&2
