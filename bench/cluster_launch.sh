# Sourced by the benchmarks that run across emulated hosts (scripts/cluster.sh): one job of NODES
# nodes × 1 rank, node k on host k+1, the master on host 1.
#
#   cluster_launch NODES PORT OUT ERR CMD...   runs CMD as every rank; rank 0's stdout goes to OUT,
#                                              every node's stderr to ERR (appended); fails when a
#                                              node does
# The caller makes the cluster (scripts/cluster.sh up NODES RATE) and takes it down.
cluster_launch() {
  local nodes=$1 port=$2 out=$3 err=$4
  shift 4
  local pids=() k status=0
  for k in $(seq 0 $((nodes - 1))); do
    scripts/cluster.sh exec $((k + 1)) build/bin/tessera launch --nnodes "$nodes" --node-rank "$k" \
      --nproc-per-node 1 --master-addr 10.213.0.1 --master-port "$port" --timeout 600 -- "$@" \
      > "$out.node$k" 2>> "$err" &
    pids+=($!)
  done
  for k in "${!pids[@]}"; do wait "${pids[$k]}" || status=$?; done
  mv "$out.node0" "$out"
  rm -f "$out".node*
  return "$status"
}
