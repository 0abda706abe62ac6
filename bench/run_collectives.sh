#!/usr/bin/env bash
# Collective bus bandwidth: tessera's Communicator and torch.distributed (Gloo) in the same run,
# same ranks, sizes and iteration counts; prints both and the ratio tessera / torch per case.
#   bench/run_collectives.sh [RANKS=2] [MAX_MB=256]
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-2}
max_mb=${2:-256}
python=$(scripts/setup.sh | tail -n 1)
scripts/build.sh bench_collectives tessera_cli >/dev/null
out=$(mktemp -d)
build/bin/tessera launch --nproc-per-node "$ranks" --master-port 29811 -- build/bin/bench_collectives "$max_mb" > "$out/tessera.jsonl"
build/bin/tessera launch --nproc-per-node "$ranks" --master-port 29812 -- build/bin/bench_collectives "$max_mb" alltoall \
  | grep reduce_scatter > "$out/tessera_alltoall.jsonl"
build/bin/tessera launch --nproc-per-node "$ranks" --master-port 29813 -- "$python" bench/collectives_torch.py "$max_mb" > "$out/torch.jsonl"
cat "$out/tessera.jsonl" "$out/tessera_alltoall.jsonl" "$out/torch.jsonl"
"$python" - "$out" <<'PY'
import json, sys
d = sys.argv[1]
load = lambda f: {(r["collective"], r["bytes"]): r for r in map(json.loads, open(f"{d}/{f}")) if "busbw_gbps" in r}
theirs = load("torch.jsonl")
for impl, ours in (("tessera", load("tessera.jsonl")), ("tessera-alltoall-rs", load("tessera_alltoall.jsonl"))):
    for key in sorted(ours):
        if key in theirs:
            print(json.dumps({"impl": impl, "collective": key[0], "bytes": key[1],
                              "tessera_busbw_gbps": ours[key]["busbw_gbps"],
                              "torch_busbw_gbps": theirs[key]["busbw_gbps"],
                              "ratio": round(ours[key]["busbw_gbps"] / theirs[key]["busbw_gbps"], 3)}))
PY
