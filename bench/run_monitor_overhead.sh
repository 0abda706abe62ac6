#!/usr/bin/env bash
# What watching a run costs (issue 47): the 85M GPT (12 layers x 768, micro 2 x 128 tokens) on 2
# ranks at ZeRO 1, with no monitor and with every monitor (csv_monitor, tensorboard, wandb and comet
# offline), the comms logger, wall_clock_breakdown and memory_breakdown on (bench/gpt_train.py
# --monitors), ROUNDS interleaved rounds; then one run with the flops profiler at step PROFILE_STEP.
# Prints each run's samples/s and the ratio per round.
#   ROUNDS (2), STEPS (14), WARMUP (4), PROFILE_STEP (8)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
python=$("$here/scripts/setup.sh" | tail -n 1)
cli="$here/build/bin/tessera"
rounds=${ROUNDS:-2} steps=${STEPS:-14} warmup=${WARMUP:-4} profile=${PROFILE_STEP:-8}
out=$(mktemp -d /tmp/tessera-monitors.XXXXXX)
shape=(--layers 12 --embd 768 --heads 12 --micro 2 --stage 1 --steps "$steps" --warmup "$warmup")
run() {  # label, extra args...
  local label=$1; shift
  env -u WANDB_API_KEY -u COMET_API_KEY WANDB_DIR="$out" COMET_OFFLINE_DIRECTORY="$out/comet" \
    "$cli" launch --nproc-per-node 2 -- "$python" "$here/bench/gpt_train.py" --impl tessera "${shape[@]}" "$@" \
    2>/dev/null | grep '^{' | tail -n 1 | "$python" -c "import json,sys; r=json.load(sys.stdin); print('$label', r['samples_per_s'])"
}
for round in $(seq "$rounds"); do
  none=$(run none | awk '{print $2}')
  all=$(run monitors --monitors "$out/round$round" | awk '{print $2}')
  "$python" -c "print('round $round: none %.3f samples/s, every monitor %.3f samples/s: %.3fx' % ($none, $all, $all / $none))"
done
profiled=$(run profiled --flops-profile "$profile" --monitors "$out/profiled" | awk '{print $2}')
echo "with the flops profiler at step $profile (inside the timed steps): $profiled samples/s"
grep -E "fwd flops per GPU|iter latency|FLOPS per GPU = 3" "$out/profiled/flops.txt" || true
echo "files: $out"
