#!/usr/bin/env bash
# Context parallelism (issue 44's benchmark) with train_gpt (C++), fp32 AdamW, ZeRO-1, one thread per rank:
#
#  A. A fixed total sequence (SEQ tokens, micro-batch 1) on 4 ranks: context 1 (data 4), 2 (data 2)
#     and 4 (data 1) for Ulysses and ring attention: peak RSS per rank, the job's tokens/s, and the
#     context group's communication as a share of the step (seconds blocked in wait, from
#     Communicator::stats: what the step could not hide; ring's sends and receives overlap with the
#     blocks' attention).
#  B. The longest sequence that trains within LIMIT MiB of peak RSS per rank at context 1, 2 and 4
#     (world = context, data 1), per method, at ZeRO-3 (over data x context: the model states fall by
#     1/cp too, as long-context runs are set up): peak RSS measured at two lengths, the line through
#     them solved for the limit, rounded down to the layout's chunks, then checked by training one
#     step at that length (stepping down 2% until it fits).
#
#   bench/run_context_parallel.sh   SEQ=4096 LAYERS=4 EMBD=128 LIMIT=1024 (MiB) LIMIT_LAYERS=8 LIMIT_EMBD=64
set -euo pipefail
cd "$(dirname "$0")/.."
seq=${SEQ:-4096} layers=${LAYERS:-4} embd=${EMBD:-128}
limit=${LIMIT:-1024} limit_layers=${LIMIT_LAYERS:-8} limit_embd=${LIMIT_EMBD:-64}
python=$(scripts/setup.sh | tail -n 1)
scripts/build.sh tessera_cli train_gpt >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=29950

config() {  # $1 context size, $2 method
  cat > "$out/config.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": ${stage:-1}},
 "context_parallel": {"size": $1, "method": "$2"}}
JSON
  echo "$out/config.json"
}

run() {  # $1 ranks, $2 context, $3 method, $4 steps, $5 log, then train_gpt's model flags
  local ranks=$1 cp=$2 method=$3 steps=$4 log=$5
  shift 5
  build/bin/tessera launch --nproc-per-node "$ranks" --master-port $((port++)) -- \
    build/bin/train_gpt --config "$(config "$cp" "$method")" --steps "$steps" "$@" > "$log" 2>&1 ||
    { tail -n 20 "$log" >&2; return 1; }
}

echo "A: total sequence $seq, 4 ranks, $layers layers x $embd" >&2
for cp in 1 2 4; do
  for method in ulysses ring; do
    [ "$cp" = 1 ] && [ "$method" = ring ] && continue
    echo "  context $cp $method" >&2
    run 4 "$cp" "$method" 4 "$out/a.$cp.$method.log" --n-layer "$layers" --n-embd "$embd" --seq-len "$seq"
  done
done

echo "B: the longest sequence within $limit MiB per rank, $limit_layers layers x $limit_embd, ZeRO-3" >&2
stage=3
peak() { grep -o 'peak rss per rank (bytes):.*' "$1" | tr ' ' '\n' | grep -E '^[0-9]+$' | sort -n | tail -n 1; }
for cp in 1 2 4; do
  for method in ulysses ring; do
    [ "$cp" = 1 ] && [ "$method" = ring ] && continue
    [ "$method" = ring ] && chunk=$((cp * 2 * 64)) || chunk=$((cp * 64))
    la=$((4096 * cp)) lb=$((8192 * cp))
    run "$cp" "$cp" "$method" 1 "$out/fit.a" --n-layer "$limit_layers" --n-embd "$limit_embd" --seq-len "$la"
    run "$cp" "$cp" "$method" 1 "$out/fit.b" --n-layer "$limit_layers" --n-embd "$limit_embd" --seq-len "$lb"
    pa=$(peak "$out/fit.a") pb=$(peak "$out/fit.b")
    len=$("$python" -c "la, lb, pa, pb, lim, c = $la, $lb, $pa, $pb, $limit * 2**20, $chunk
slope = (pb - pa) / (lb - la)
print(int((la + (lim - pa) / slope) // c * c))")
    while :; do
      echo "  context $cp $method: trying $len tokens" >&2
      run "$cp" "$cp" "$method" 1 "$out/b.$cp.$method.log" --n-layer "$limit_layers" --n-embd "$limit_embd" --seq-len "$len"
      p=$(peak "$out/b.$cp.$method.log")
      [ "$p" -le $((limit * 1048576)) ] && break
      len=$(( (len * 98 / 100) / chunk * chunk ))
    done
    echo "$cp $method $len $p $pa $pb $la $lb" >> "$out/b.txt"
  done
done

"$python" - "$out" "$seq" "$limit" <<'PY'
import re, sys
d, seq, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def parse(path):
    text = open(path).read()
    steps = re.findall(r"step (\d+) \| .*?([0-9.]+) tokens/s \| step ([0-9.]+) ms", text)
    rss = [int(x) for x in re.search(r"peak rss per rank \(bytes\):([ 0-9]+)", text).group(1).split()]
    blocked = sum(float(m) for m in re.findall(r"context group \S+: .*?([0-9.]+) s blocked in wait", text))
    sent = sum(float(m) for m in re.findall(r"context group \S+: \d+ calls, ([0-9.]+) MB sent", text))
    timed = steps[1:]  # the first step warms up
    ms = sorted(float(s[2]) for s in timed)[len(timed) // 2]
    tps = sorted(float(s[1]) for s in timed)[len(timed) // 2]
    n = len(steps)
    return {"tokens_per_s": tps, "step_ms": ms, "rss": rss, "blocked_s_per_step": blocked / n, "mb_per_step": sent / n}
print("A. total sequence %d tokens, 4 ranks (micro-batch 1; context 1 = data 4, 2 = data 2, 4 = data 1)\n" % seq)
print("| context | method | tokens/s | step (ms) | peak RSS per rank (MiB) | context comm blocked per step (ms) | share of step | sent per step (MB) |")
print("|---|---|---|---|---|---|---|---|")
base = None
for cp, method in ((1, "ulysses"), (2, "ulysses"), (2, "ring"), (4, "ulysses"), (4, "ring")):
    r = parse("%s/a.%d.%s.log" % (d, cp, method))
    base = base or r
    print("| %d | %s | %.0f | %.0f | %s | %.1f | %.1f%% | %.2f |" % (
        cp, method if cp > 1 else "-", r["tokens_per_s"], r["step_ms"], " ".join(str(b >> 20) for b in r["rss"]),
        1e3 * r["blocked_s_per_step"], 100 * r["blocked_s_per_step"] / (r["step_ms"] / 1e3), r["mb_per_step"]))
print("\nB. the longest sequence that trains within %d MiB of peak RSS per rank (world = context, data 1, ZeRO-3)\n"
      % limit)
print("| context | method | longest sequence | vs context 1 | its peak RSS (MiB) | fit: peak at L_a, L_b (MiB) |")
print("|---|---|---|---|---|---|")
rows = [l.split() for l in open("%s/b.txt" % d)]
one = next(int(r[2]) for r in rows if r[0] == "1")
for cp, method, length, p, pa, pb, la, lb in rows:
    print("| %s | %s | %s | %.2fx | %d | %d at %s, %d at %s |" % (cp, method if cp != "1" else "-", length,
                                                           int(length) / one, int(p) >> 20, int(pa) >> 20, la,
                                                           int(pb) >> 20, lb))
PY
