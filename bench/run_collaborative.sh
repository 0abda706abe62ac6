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
# MODE:COMPRESSION puts the averaged tensors on the wire as fp16 or 8bit; a mode named twice runs
# twice (runs vary: which peers meet in a round is decided by the timing of the matchmaking).
#
#   bench/run_collaborative.sh [MODES] [RATE=100mbit] [TARGET=0.34]     (root: namespaces)
#   KEEP_DIR=DIR PEERS=4 SLOWDOWN=2 TARGET_BATCH=16384 HIDDEN=512 TIME_LIMIT=120 EXTRA="--lr 3e-4" as variables
# Prints a markdown table (each run's time to the target and the median) and, on stderr, one JSON
# line per run.
set -euo pipefail
cd "$(dirname "$0")/.."
modes=${1:-alone hivemind hivemind-local hivemind-local tessera tessera tessera:fp16 tessera-diloco tessera-diloco:8bit}
rate=${2:-100mbit}
target=${3:-0.34}
peers=${PEERS:-4}
slowdown=${SLOWDOWN:-2}
python=$(bench/setup_hivemind.sh | tail -n 1)
out=${KEEP_DIR:-$(mktemp -d)}  # KEEP_DIR: the peers' logs and JSON files stay there
mkdir -p "$out"
trap 'scripts/cluster.sh down >/dev/null 2>&1 || true; [ -n "${KEEP_DIR:-}" ] || rm -rf "$out"' EXIT
scripts/cluster.sh up "$peers" "$rate" >/dev/null
i=0
for spec in $modes; do  # a mode named twice runs twice (the table shows each run and the median)
  i=$((i + 1))
  mode=${spec%%:*}
  compression=none
  [[ $spec == *:* ]] && compression=${spec#*:}
  n=$peers
  [ "$mode" = alone ] && n=1
  dir="$out/$i.$spec"
  mkdir -p "$dir"
  pids=()
  for k in $(seq 0 $((n - 1))); do
    slow=1
    [ "$n" -gt 1 ] && [ "$k" = $((n - 1)) ] && slow=$slowdown
    scripts/cluster.sh exec $((k + 1)) "$python" bench/collaborative_train.py --mode "$mode" --peer "$k" --peers "$n" \
      --dir "$dir" --host "10.213.0.$((k + 1))" --compression "$compression" --slowdown "$slow" --target-loss "$target" \
      --target-batch "${TARGET_BATCH:-16384}" --hidden "${HIDDEN:-512}" --time-limit "${TIME_LIMIT:-120}" \
      ${EXTRA:-} > "$dir/peer$k.log" 2>&1 &
    pids+=($!)
  done
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}" || { echo "$spec: peer $k failed:" >&2; tail -n 20 "$dir/peer$k.log" >&2; exit 1; }
  done
  echo "[bench] $spec done" >&2
done
"$python" - "$out" "$rate" "$target" $modes <<'PY'
import json, os, statistics, sys
folder, rate, target, modes = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
runs = {}  # spec -> one dict per run
for i, spec in enumerate(modes, 1):
    d = os.path.join(folder, "%d.%s" % (i, spec))
    peers = sorted((json.load(open(os.path.join(d, f))) for f in os.listdir(d) if f.startswith("peer") and f.endswith(".json")),
                   key=lambda p: p["peer"])
    runs.setdefault(spec, []).append({
        "mode": spec, "link": rate, "target_loss": target, "seconds_to_target": peers[0]["reached"],
        "rounds": peers[0]["rounds"], "samples_all_peers": sum(p["samples"] for p in peers),
        "steps_per_peer": [p["steps"] for p in peers], "best_loss": min(l for _, l in peers[0]["evals"]),
        "round_groups": [r["group"] for r in peers[0]["round_details"]]})


def median_seconds(spec):
    """The median run's time to the target (a run that did not reach it counts as infinitely slow)."""
    times = [r["seconds_to_target"] or float("inf") for r in runs[spec]]
    m = statistics.median_low(times)
    return None if m == float("inf") else m


# the ratio is against the faster of Hivemind's two modes (> 1: faster than Hivemind)
base = min((median_seconds(m) for m in runs if m.startswith("hivemind") and median_seconds(m)), default=None)
print("| mode | s to loss %.2f (median) | each run | vs Hivemind | rounds | samples (all peers) | best loss |" % target)
print("|---|---|---|---|---|---|---|")
for spec, rs in runs.items():
    s = median_seconds(spec)
    each = ", ".join("%.1f" % r["seconds_to_target"] if r["seconds_to_target"] else "-" for r in rs)
    print("| %s | %s | %s | %s | %s | %s | %.3f |" % (
        spec, "%.1f" % s if s else "not reached", each, "%.2fx" % (base / s) if base and s else "-",
        "/".join(str(r["rounds"]) for r in rs), "/".join(str(r["samples_all_peers"]) for r in rs),
        min(r["best_loss"] for r in rs)))
    for r in rs:
        print(json.dumps(r), file=sys.stderr)
PY
