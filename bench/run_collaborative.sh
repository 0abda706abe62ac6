#!/usr/bin/env bash
# Collaborative training, side by side in one run (issue 49's benchmark): PEERS peers, each on its
# own emulated host (scripts/cluster.sh: network namespaces, every host's link shaped to RATE with
# tc tbf), the last one SLOWDOWN times slower than the others; the same MLP, data, Adam and target
# batch size in every mode; time until peer 0's held-out loss reaches TARGET (bench/collaborative_train.py):
#   alone            one peer by itself (tessera's engine)
#   hivemind         hivemind.Optimizer over plain PyTorch (gradient averaging: Hivemind's default)
#   hivemind-local   hivemind.Optimizer(use_local_updates=True) (parameter averaging)
#   tessera          tessera.collaborative over tessera's engine (parameter averaging)
#   tessera-diloco   the same with DiLoCo's outer Nesterov step
# MODE:COMPRESSION puts the averaged tensors on the wire as fp16 or 8bit.
#
#   bench/run_collaborative.sh [MODES] [RATE=100mbit] [TARGET=0.36]     (root: namespaces)
#   KEEP_DIR=DIR PEERS=4 SLOWDOWN=2 TARGET_BATCH=8192 HIDDEN=1024 TIME_LIMIT=120 EXTRA="--lr 3e-4" as variables
# Prints a markdown table and, on stderr, one JSON line per mode.
set -euo pipefail
cd "$(dirname "$0")/.."
modes=${1:-alone hivemind hivemind-local tessera tessera:fp16 tessera-diloco tessera-diloco:8bit}
rate=${2:-100mbit}
target=${3:-0.36}
peers=${PEERS:-4}
slowdown=${SLOWDOWN:-2}
python=$(bench/setup_hivemind.sh | tail -n 1)
out=${KEEP_DIR:-$(mktemp -d)}  # KEEP_DIR: the peers' logs and JSON files stay there
mkdir -p "$out"
trap 'scripts/cluster.sh down >/dev/null 2>&1 || true; [ -n "${KEEP_DIR:-}" ] || rm -rf "$out"' EXIT
scripts/cluster.sh up "$peers" "$rate" >/dev/null
for spec in $modes; do
  mode=${spec%%:*}
  compression=none
  [[ $spec == *:* ]] && compression=${spec#*:}
  n=$peers
  [ "$mode" = alone ] && n=1
  dir="$out/$spec"
  mkdir -p "$dir"
  pids=()
  for k in $(seq 0 $((n - 1))); do
    slow=1
    [ "$n" -gt 1 ] && [ "$k" = $((n - 1)) ] && slow=$slowdown
    scripts/cluster.sh exec $((k + 1)) "$python" bench/collaborative_train.py --mode "$mode" --peer "$k" --peers "$n" \
      --dir "$dir" --host "10.213.0.$((k + 1))" --compression "$compression" --slowdown "$slow" --target-loss "$target" \
      --target-batch "${TARGET_BATCH:-8192}" --hidden "${HIDDEN:-1024}" --time-limit "${TIME_LIMIT:-120}" \
      ${EXTRA:-} > "$dir/peer$k.log" 2>&1 &
    pids+=($!)
  done
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}" || { echo "$spec: peer $k failed:" >&2; tail -n 20 "$dir/peer$k.log" >&2; exit 1; }
  done
  echo "[bench] $spec done" >&2
done
"$python" - "$out" "$rate" "$target" $modes <<'PY'
import json, os, sys
folder, rate, target, modes = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
rows = {}
for spec in modes:
    d = os.path.join(folder, spec)
    peers = [json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d)) if f.endswith(".json") and f.startswith("peer")]
    lead = next(p for p in peers if p["peer"] == 0)
    rows[spec] = {"mode": spec, "link": rate, "target_loss": target, "seconds_to_target": lead["reached"],
                  "rounds": lead["rounds"], "samples_all_peers": sum(p["samples"] for p in peers),
                  "steps_per_peer": [p["steps"] for p in sorted(peers, key=lambda p: p["peer"])],
                  "best_loss": min((l for _, l in lead["evals"]), default=None)}
# the ratio is against the faster of Hivemind's two modes (> 1: faster than Hivemind)
base = min((r["seconds_to_target"] for m, r in rows.items() if m.startswith("hivemind") and r["seconds_to_target"]),
           default=None)
print("| mode | s to loss %.2f | vs Hivemind | rounds | samples (all peers) | best loss |" % target)
print("|---|---|---|---|---|---|")
for spec in modes:
    r = rows[spec]
    s = r["seconds_to_target"]
    ratio = "%.2fx" % (base / s) if base and s else "-"
    print("| %s | %s | %s | %d | %d | %.3f |" % (spec, "%.1f" % s if s else "not reached", ratio, r["rounds"],
                                              r["samples_all_peers"], r["best_loss"] or float("nan")))
    print(json.dumps(r), file=sys.stderr)
PY
