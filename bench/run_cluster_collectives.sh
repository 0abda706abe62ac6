#!/usr/bin/env bash
# Collectives between two emulated hosts (scripts/cluster.sh: network namespaces on a bridge, each
# host's link shaped with tc tbf) at each RATE, one rank per host, tessera's Communicator over
# Gloo: bus bandwidth against the shaped rate, the physical limit of that link (with 2 ranks an
# allreduce puts the whole buffer on each link once, a reduce-scatter or allgather half of it).
#   bench/run_cluster_collectives.sh [RATES="1gbit 10gbit"] [MAX_MB=64]      (root: namespaces)
set -euo pipefail
cd "$(dirname "$0")/.."
rates=${1:-1gbit 10gbit}
max_mb=${2:-64}
python=$(scripts/setup.sh | tail -n 1)
scripts/build.sh bench_collectives tessera_cli >/dev/null
source bench/cluster_launch.sh
out=$(mktemp -d)
trap 'scripts/cluster.sh down; rm -rf "$out"' EXIT
port=29850
for rate in $rates; do
  scripts/cluster.sh up 2 "$rate" >/dev/null
  cluster_launch 2 $((port++)) "$out/$rate.jsonl" "$out/err.log" build/bin/bench_collectives "$max_mb" ||
    { tail -n 20 "$out/err.log" >&2; exit 1; }
  scripts/cluster.sh down
done
"$python" - "$out" $rates <<'PY'
import json, re, sys
folder, rates = sys.argv[1], sys.argv[2:]
print("| link | collective | MB | busbw Gbit/s | of the link |")
print("|---|---|---|---|---|")
for rate in rates:
    gbit = float(re.match(r"([0-9.]+)gbit", rate).group(1))
    for line in open("%s/%s.jsonl" % (folder, rate)):
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        busbw = 8 * r["busbw_gbps"]  # the benchmark's GB/s -> Gbit/s
        print(json.dumps({"link_gbit": gbit, **r, "busbw_gbit": round(busbw, 3),
                          "fraction_of_link": round(busbw / gbit, 3)}), file=sys.stderr)
        print("| %s | %s | %d | %.3f | %.2f |" % (rate, r["collective"], r["bytes"] >> 20, busbw, busbw / gbit))
PY
