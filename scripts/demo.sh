#!/usr/bin/env bash
# The main job: the byte-level GPT written as a plain torch.nn.Module (examples/python/train_gpt.py)
# on Debian's `fortunes` corpus, trained through tessera's Python API on 2 local ranks started by
# `tessera launch`: ZeRO stage 2, bf16 compute with fp32 master weights
# (configs/zero2_bf16_monitor.json = configs/zero2_bf16.json + csv_monitor). Progress lines every
# 10 steps; the loss falls from ln(256) = 5.5. Rank 0 writes every step's metrics to
# out/demo_gpt/metrics.jsonl, and `tessera plot` draws them at the end (out/demo_gpt/loss.png).
#   STEPS=150 by default; `make demo STEPS=400` trains longer.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
steps=${STEPS:-150}
python=$(cat "$build/.tessera-python" 2>/dev/null || scripts/setup.sh | tail -n 1)
config=configs/zero2_bf16_monitor.json
metrics=out/demo_gpt/metrics.jsonl  # {csv_monitor.output_path}/{csv_monitor.job_name}/metrics.jsonl
plot=out/demo_gpt/loss.png

echo "== tessera launch --nproc-per-node 2 -- python examples/python/train_gpt.py --config $config --steps $steps"
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
  "$build/bin/tessera" launch --nproc-per-node 2 -- "$python" examples/python/train_gpt.py --config "$config" --steps "$steps"
echo "== tessera plot $metrics -o $plot"
"$build/bin/tessera" plot "$metrics" -o "$plot"
echo "loss plot: $PWD/$plot"
