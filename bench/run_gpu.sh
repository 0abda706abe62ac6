#!/usr/bin/env bash
# The GPU measurement of docs/gpu.md in one command, for a machine with one NVIDIA GPU and a CUDA
# PyTorch in `python3` (the device machine of the tool library; no apt or network there):
#
#   bench/run_gpu.sh build           configure and build tessera._C and the CLI against that torch
#                                    (header-only dependencies from .devdeps/, made on the
#                                    development machine by ../shared/device/fetch-deps.sh)
#   bench/run_gpu.sh test            ctest -L gpu: tests/python/gpu/test_gpu.py
#   bench/run_gpu.sh bench SIZE...   bench/gpu_gpt.py for each size (350m, 1.3b, 125m, tiny): the
#                                    plain PyTorch loops ($PLAIN) and tessera ZeRO $STAGES, all at the largest
#                                    micro-batch of $MICROS_<size> that every one of them fits
#   bench/run_gpu.sh offload SIZE    tessera at ZeRO 2 without offload, offload_optimizer cpu (also
#                                    with the delayed parameter update, and with super_offload, with and
#                                    without clipping) and nvme, and at ZeRO 3 without, and with the optimizer (cpu, nvme)
#                                    and the shards (offload_param cpu) on the host, micro-batch
#                                    $MICRO (16), swap files under $NVME_PATH (/tmp)
#   bench/run_gpu.sh all SIZE...     build, test and bench in order
#
# Results: JSON lines in $RESULTS/gpu_gpt.jsonl (RESULTS defaults to $OUT where the device tool
# sets it, else bench/results), logs beside them. PYTHON, BUILD_DIR (build-gpu), STAGES ("0 1 2"),
# STEPS (30), WARMUP (10), SEQ (1024) override.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
build=${BUILD_DIR:-build-gpu}
results=${RESULTS:-${OUT:-bench/results}}
mkdir -p "$results"

do_build() {
  local prefix
  prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  # outside the source tree: the install's exported targets may not name paths inside it
  if [ -d .devdeps/usr ]; then
    rm -rf /tmp/tessera-devdeps && cp -a .devdeps /tmp/tessera-devdeps
    prefix="$prefix;/tmp/tessera-devdeps/usr"
  fi
  # The device machine's g++ (/opt/gcc) has only a static libstdc++; a second copy of it beside
  # the shared one torch loads crashes at the first stream insertion (std::locale). Link the
  # system's shared libstdc++ by path, before anything asks for the static one.
  local stdcxx shared_stdcxx=""
  stdcxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
  [ -n "$stdcxx" ] && shared_stdcxx="-Wl,--no-as-needed $stdcxx -Wl,--as-needed"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_MODULE_LINKER_FLAGS="$shared_stdcxx" -DCMAKE_EXE_LINKER_FLAGS="$shared_stdcxx" \
    -DPython_EXECUTABLE="$(command -v "$python")" -DTESSERA_BUILD_BENCH=OFF >"$results/build.log" 2>&1 ||
    { tail -40 "$results/build.log"; return 1; }
  cmake --build "$build" -j "$(nproc)" --target tessera_python tessera_cli >>"$results/build.log" 2>&1 ||
    { grep -B2 -A12 'error' "$results/build.log" | head -80; return 1; }
  echo "[gpu] built $(ls python/tessera/_C*.so)"
}

do_test() {
  # The in-place extension (no package index there for pip install -e): the tests' workers import it.
  PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" ctest --test-dir "$build" -L gpu -V 2>&1 |
    tee "$results/gpu_tests.log" | tail -60
}

run_one() {  # impl stage size micro -> prints the JSON line, returns 3 when it does not fit
  PYTHONUNBUFFERED=1 "$python" bench/gpu_gpt.py --impl "$1" --stage "$2" --size "$3" --micro "$4" \
    --seq "${SEQ:-1024}" --steps "${STEPS:-30}" --warmup "${WARMUP:-10}" 2>>"$results/bench.log"
}

do_bench() {
  local size micro impl stage line rc fits
  for size in "$@"; do
    local var="MICROS_${size//./_}"
    local micros=${!var:-}
    if [ -z "$micros" ]; then
      case $size in 350m) micros="32 16 8";; 1.3b) micros="16 8 4";; *) micros="16 8";; esac
    fi
    for micro in $micros; do
      fits=1
      for spec in ${PLAIN:-plain:0 plain-master:0} $(for s in ${STAGES:-0 1 2}; do echo tessera:$s; done); do
        impl=${spec%%:*} stage=${spec##*:}
        rc=0
        line=$(run_one "$impl" "$stage" "$size" "$micro") || rc=$?
        if [ "$rc" -eq 3 ]; then
          echo "[gpu] $size micro $micro: $impl zero$stage does not fit, trying a smaller micro-batch"
          fits=0
          break
        elif [ "$rc" -ne 0 ]; then
          echo "[gpu] $size micro $micro: $impl zero$stage failed ($rc):"; tail -20 "$results/bench.log"
          return 1
        fi
        echo "$line" | tee -a "$results/gpu_gpt.jsonl"
      done
      [ "$fits" -eq 1 ] && break
    done
    [ "$fits" -eq 1 ] || echo "[gpu] $size: none of the micro-batches ($micros) fits"
  done
  return 0
}

do_offload() {
  local size=${1:-350m} micro=${MICRO:-16} nvme=${NVME_PATH:-/tmp} spec stage extra line rc
  # super_offload's rows with clipping at 1.0 (the others' setting: while the norm is above it,
  # each speculation is redone) and without clipping beside the plain and offloaded rows without it.
  for spec in "2:" "2:--offload cpu" "2:--offload cpu --delayed 5" "2:--offload cpu --super-offload" \
              "2:--clip 0" "2:--clip 0 --offload cpu" "2:--clip 0 --offload cpu --super-offload" "2:--offload nvme" \
              "3:" "3:--offload cpu --offload-param" "3:--offload nvme --offload-param" "3:--offload cpu --super-offload"; do
    stage=${spec%%:*} extra=${spec#*:}
    rc=0
    # shellcheck disable=SC2086
    line=$(PYTHONUNBUFFERED=1 "$python" bench/gpu_gpt.py --impl tessera --stage "$stage" --size "$size" \
      --micro "$micro" --seq "${SEQ:-1024}" --steps "${STEPS:-30}" --warmup "${WARMUP:-10}" --nvme-path "$nvme" \
      $extra 2>>"$results/bench.log") || rc=$?
    if [ "$rc" -ne 0 ]; then
      echo "[gpu] $size micro $micro: zero$stage $extra failed ($rc):"; tail -20 "$results/bench.log"
      continue
    fi
    echo "$line" | tee -a "$results/gpu_offload.jsonl"
  done
}

what=${1:-all}
shift || true
case $what in
  build) do_build ;;
  test) do_test ;;
  bench) do_bench "$@" ;;
  offload) do_offload "$@" ;;
  all) do_build && do_test && do_bench "${@:-350m 1.3b}" ;;
  *) echo "usage: bench/run_gpu.sh build|test|bench SIZE...|offload SIZE|all [SIZE...]" >&2; exit 2 ;;
esac
