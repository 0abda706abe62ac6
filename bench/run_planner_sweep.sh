#!/usr/bin/env bash
# The layout planner against the measured sweep (issue 50, docs/planner.md): the 85M GPT
# (12 layers x 768, 12 heads, block 128) on 4 CPU ranks, a global batch of 8, every layout
# `tessera plan` considers feasible (data/tensor/pipeline degrees, ZeRO 0-3, micro-batch) run for
# 5 steps each with build/bin/train_gpt; then the same (4 steps) on 2 emulated hosts x 2 ranks with
# a 1 Gbit/s link between them (scripts/cluster.sh; root), the planner told the link's rate and that
# the hosts are emulated on this machine (--emulated-hosts: all 4 ranks share its cores).
#
#   bench/run_planner_sweep.sh [local|hosts|both|schedules|moe]     (default both; about 20 minutes each)
#
# local and hosts time the 1F1B layouts (the sweeps docs/benchmarks.md averages); schedules the
# pipeline schedules against each other: every layout of tp 1 and ZeRO 0 on 4 ranks of one host
# (1F1B, ZB-H1, ZB-V and interleaved 1F1B with 2 chunks a stage; about 15 minutes); moe an MoE GPT
# (8 layers x 512, 4 experts of top-2 in every other block, dropless) on 4 ranks without a pipeline,
# micro-batch 2: every expert degree, tensor degree and ZeRO stage (about 12 minutes).
#
# The planner's calibration is measured first (tessera plan --measure: this machine's layer
# shapes, memory and Gloo among the ranks), then cached for the sweep. Prints each sweep's JSON
# summary (first choice / measured best, best of the top 3 / measured best, Spearman's rank
# correlation of predicted and measured step times) and its table.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-both}
scripts/build.sh tessera_cli train_gpt >/dev/null
out=${OUT:-$(mktemp -d)}
model=(--layers 12 --hidden 768 --heads 12 --seq-len 128)
if [ "$what" = local ] || [ "$what" = both ]; then
  build/bin/tessera plan --device cpu --gpus-per-node 4 --global-batch 8 --layers 12 --hidden 768 --heads 12 \
    --vocab 256 --seq-len 128 --max-positions 128 --no-offload --no-cp --activation-checkpointing none --measure >/dev/null
  python3 bench/planner_sweep.py --ranks 4 --global-batch 8 --steps 5 "${model[@]}" --out "$out/local.json" \
    --plan-args "--no-offload --no-cp --activation-checkpointing none --schedule 1f1b"
fi
if [ "$what" = schedules ]; then
  build/bin/tessera plan --device cpu --gpus-per-node 4 --global-batch 8 --layers 12 --hidden 768 --heads 12 \
    --vocab 256 --seq-len 128 --max-positions 128 --no-offload --no-cp --activation-checkpointing none --measure >/dev/null
  python3 bench/planner_sweep.py --ranks 4 --global-batch 8 --steps 5 "${model[@]}" --out "$out/schedules.json" \
    --plan-args "--no-offload --no-cp --activation-checkpointing none --tp 1 --zero 0"
fi
if [ "$what" = moe ]; then
  moe_model=(--layers 8 --hidden 512 --heads 8 --seq-len 128)
  moe_args="--no-offload --no-cp --activation-checkpointing none --pp 1 --micro-batch 2 --moe-experts 4 --moe-every 2 --moe-k 2"
  build/bin/tessera plan --device cpu --gpus-per-node 4 --global-batch 8 --layers 8 --hidden 512 --heads 8 \
    --vocab 256 --seq-len 128 --max-positions 128 $moe_args --measure >/dev/null
  python3 bench/planner_sweep.py --ranks 4 --global-batch 8 --steps 5 "${moe_model[@]}" --out "$out/moe.json" \
    --plan-args "$moe_args"
fi
if [ "$what" = hosts ] || [ "$what" = both ]; then
  scripts/cluster.sh up 2 1gbit >/dev/null
  trap 'scripts/cluster.sh down >/dev/null 2>&1 || true' EXIT
  ssh_config=$(scripts/cluster.sh ssh-config)
  printf '10.213.0.1 slots=2\n10.213.0.2 slots=2\n' > "$out/hostfile"
  plan_args="--no-offload --no-cp --activation-checkpointing none --schedule 1f1b --inter-node-bw 0.125 --emulated-hosts"
  build/bin/tessera plan --device cpu --gpus-per-node 2 --nodes 2 --global-batch 8 --layers 12 --hidden 768 \
    --heads 12 --vocab 256 --seq-len 128 --max-positions 128 $plan_args --measure >/dev/null
  GLOO_SOCKET_IFNAME=eth0 python3 bench/planner_sweep.py --ranks 4 --ranks-per-node 2 --global-batch 8 --steps 4 "${model[@]}" \
    --hostfile "$out/hostfile" --plan-args "$plan_args" \
    --launch-args "[\"--launcher\", \"ssh\", \"--config\", \"{\\\"hosts\\\": {\\\"ssh_args\\\": [\\\"-F\\\", \\\"$ssh_config\\\"]}}\"]" \
    --out "$out/hosts.json"
fi
echo "results: $out" >&2
