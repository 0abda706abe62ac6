#!/usr/bin/env bash
# The demo until the data-parallel engine lands: 2 local ranks started by `tessera launch`, each
# checking every collective against hand-computed values, then the collective benchmark's smaller
# sizes against torch.distributed.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== tessera config check configs/zero2_bf16.json --world-size 2"
build/bin/tessera config check configs/zero2_bf16.json --world-size 2 | head -n 12
echo "   ..."
echo "== tessera launch --nproc-per-node 2 --tag-output -- tessera_test_worker collectives"
build/bin/tessera launch --nproc-per-node 2 --tag-output -- build/bin/tessera_test_worker collectives
echo "== collective bus bandwidth, tessera vs torch.distributed (Gloo), 2 ranks, up to 16 MB"
bench/run_collectives.sh 2 16 | tail -n 9
