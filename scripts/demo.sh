#!/usr/bin/env bash
# The main job: the byte-level GPT (examples/models/gpt.cpp) on Debian's `fortunes` corpus, on 2
# local ranks started by `tessera launch`, ZeRO stage 2 with bf16 compute and fp32 master weights
# (configs/zero2_bf16.json). Progress lines every 10 steps; the loss falls from ln(256) = 5.5.
#   STEPS=150 by default; `make demo STEPS=400` trains longer.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-150}
echo "== tessera launch --nproc-per-node 2 -- train_gpt --config configs/zero2_bf16.json --steps $steps"
build/bin/tessera launch --nproc-per-node 2 -- build/bin/train_gpt --config configs/zero2_bf16.json --steps "$steps"
