#!/usr/bin/env bash
# The main job: the byte-level GPT written as a plain torch.nn.Module (examples/python/train_gpt.py)
# on Debian's `fortunes` corpus, trained through tessera's Python API on 2 local ranks started by
# `tessera launch`: ZeRO stage 2, bf16 compute with fp32 master weights
# (configs/zero2_bf16_monitor.json = configs/zero2_bf16.json + csv_monitor) on a CPU with bf16
# arithmetic (AVX512_BF16 or AMX-BF16), fp32 (configs/zero2_fp32_monitor.json) on one without,
# where bf16 runs ~11x slower; DTYPE=bf16 or DTYPE=fp32 chooses by hand. Progress lines every
# 10 steps; the loss falls from ln(256) = 5.5. Rank 0 writes every step's metrics to
# out/demo_gpt/metrics.jsonl, and `tessera plot` draws them at the end (out/demo_gpt/loss.png).
#   STEPS=150 by default; `make demo STEPS=400` trains longer.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
steps=${STEPS:-150}
python=$(cat "$build/.tessera-python" 2>/dev/null || scripts/setup.sh | tail -n 1)
dtype=${DTYPE:-}
if [ -z "$dtype" ]; then
  if "$python" -c 'import sys, tessera; sys.exit(0 if tessera._C.cpu_has_fast_bf16() else 1)'; then
    dtype=bf16
    echo "== this CPU has bf16 arithmetic: training in bf16 (DTYPE=fp32 to change)"
  else
    dtype=fp32
    echo "== this CPU has no bf16 arithmetic (no AVX512_BF16 or AMX-BF16), where bf16 runs ~11x slower: training in fp32 (DTYPE=bf16 to change)"
  fi
fi
config=configs/zero2_${dtype}_monitor.json
metrics=out/demo_gpt/metrics.jsonl  # {csv_monitor.output_path}/{csv_monitor.job_name}/metrics.jsonl
plot=out/demo_gpt/loss.png

echo "== tessera launch --nproc-per-node 2 -- python examples/python/train_gpt.py --config $config --steps $steps"
"$build/bin/tessera" launch --nproc-per-node 2 -- "$python" examples/python/train_gpt.py --config "$config" --steps "$steps"
echo "== tessera plot $metrics -o $plot"
"$build/bin/tessera" plot "$metrics" -o "$plot"
echo "loss plot: $PWD/$plot"
