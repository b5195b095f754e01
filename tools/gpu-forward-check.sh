#!/bin/bash
# tools/gpu-forward-check.sh: the GPU forward's checks in one device call.
#   1. build megamoe and tests/test_gpu_forward with CUDA for sm_90a only (the H200);
#   2. tests/test_gpu_forward_blocks and tests/test_gpu_forward (all cases but the V4-Flash one);
#   3. compute-sanitizer memcheck on the embedded tiny model's case, CUDA graphs off and on;
#   4. the V4-Flash-width case (its checkpoint is kept in $FLASH for the bench);
#   5. megamoe bench forward --backend gpu on the tiny fixture and on the V4-Flash-width checkpoint,
#      --cuda-graph off and on.
#   "profile" (after "flash"): Nsight Compute's kernel durations of one decode step (position 12)
#      of the V4-Flash-width checkpoint, kernels serialized (tools/ncu_step.py), in
#      $OUT/decode-step-profile.txt.
#   "profile-tc" (after "flash"): Nsight Compute's full sections of the `tc` recipe's FP8 linears
#      (MMOE_GPU_FP8_LINEARS=tc) of one decode step, and the SASS instructions where their warps
#      stall (tools/ncu_sass_stalls.py) in $OUT/tc-stalls.txt.
# Logs go to $OUT.  Usage on the device machine (see tools/gpu-check.sh for the tarball layout):
#   MMOE_DEBS=$PWD/.gpu/debs bash /tmp/m/tools/gpu-forward-check.sh [STEPS]
# STEPS: a subset of "build test memcheck racecheck flash profile profile-tc bench break" (default: build test
# memcheck flash bench).  BLOCKS_RUNS (default 1): runs of test_gpu_forward_blocks in "test", each
# with its own seed; every failure line is printed with the run's seed.  "racecheck": the blocks
# suite under compute-sanitizer racecheck and synccheck (shared-memory hazards, barriers).
# "break" (last: it edits the tree) applies $BREAK_PATCH (deliberate bugs, one per block) and
# runs the suites again, which must fail.
set -u
OUT=${OUT:-/tmp/mmoe-out}
mkdir -p "$OUT"
STEPS=${1:-build test memcheck flash bench}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tools/gpu-env.sh
. "$ROOT/tools/gpu-env.sh"
export PATH=/usr/local/cuda/bin:$PATH
cd "$ROOT" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
case " $STEPS " in *" build "*)
  t0=$(date +%s)
  ( mmoe_configure_h200 > "$OUT/configure.log" 2>&1 && make -j16 > "$OUT/build.log" 2>&1 \
      && make -j16 tests/test_gpu_forward tests/test_gpu_forward_blocks >> "$OUT/build.log" 2>&1 ) \
    || { echo "BUILD FAILED"; tail -n 40 "$OUT/configure.log" "$OUT/build.log"; exit 1; }
  echo "build: ok ($(( $(date +%s) - t0 )) s)";;
esac
export MMOE_SRCDIR=$ROOT MMOE_BUILDDIR=$ROOT MMOE_BIN=$ROOT/megamoe CK_VERBOSITY=verbose
FLASH=/tmp/mmoe-flash
case " $STEPS " in *" test "*)
  for run in $(seq 1 "${BLOCKS_RUNS:-1}"); do
    t0=$(date +%s)
    timeout 200 ./tests/test_gpu_forward_blocks > "$OUT/test-blocks-$run.log" 2>&1
    echo "test_gpu_forward_blocks run $run: rc=$? ($(( $(date +%s) - t0 )) s), $(grep -m1 -o 'seed [0-9]*' "$OUT/test-blocks-$run.log")"
    grep -E ":[FE]:|Checks" "$OUT/test-blocks-$run.log" | tail -n 10
  done
  t0=$(date +%s)
  CK_EXCLUDE_TAGS=flash OPENBLAS_NUM_THREADS=16 timeout 300 ./tests/test_gpu_forward > "$OUT/test.log" 2>&1
  echo "test_gpu_forward (all but flash): rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "gpu_forward:|:[PFE]:|Checks" "$OUT/test.log" | tail -n 60;;
esac
case " $STEPS " in *" memcheck "*)
  if command -v compute-sanitizer > /dev/null; then
    t0=$(date +%s)
    CK_RUN_CASE=tiny timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
      ./tests/test_gpu_forward > "$OUT/memcheck.log" 2>&1
    echo "memcheck (tiny): rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "ERROR SUMMARY|Invalid|Checks" "$OUT/memcheck.log" | head
    # the same case with every decode step one CUDA graph replay
    t0=$(date +%s)
    CK_RUN_CASE=tiny MMOE_GPU_GRAPH=1 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
      ./tests/test_gpu_forward > "$OUT/memcheck-graph.log" 2>&1
    echo "memcheck (tiny, MMOE_GPU_GRAPH=1): rc=$? ($(( $(date +%s) - t0 )) s)"
    grep -E "ERROR SUMMARY|Invalid|Checks" "$OUT/memcheck-graph.log" | head
  else echo "memcheck: compute-sanitizer not found"; fi;;
esac
case " $STEPS " in *" racecheck "*)
  if command -v compute-sanitizer > /dev/null; then
    for tool in racecheck synccheck; do
      t0=$(date +%s)
      timeout 300 compute-sanitizer --tool $tool --error-exitcode 3 ./tests/test_gpu_forward_blocks > "$OUT/$tool.log" 2>&1
      echo "$tool (blocks): rc=$? ($(( $(date +%s) - t0 )) s)"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|:[FE]:|Checks" "$OUT/$tool.log" | head
    done
  else echo "racecheck: compute-sanitizer not found"; fi;;
esac
case " $STEPS " in *" flash "*)
  t0=$(date +%s)
  CK_RUN_CASE=flash MMOE_GPU_FWD_FLASH_DIR=$FLASH OPENBLAS_NUM_THREADS=16 timeout 300 ./tests/test_gpu_forward \
    > "$OUT/test-flash.log" 2>&1
  echo "test_gpu_forward (flash): rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E "gpu_forward:|:[PFE]:|Checks" "$OUT/test-flash.log" | tail -n 20
  # a seed at which a last-bit difference of a routing weight (the router's log1p) moves an expert's FP8 group scale
  t0=$(date +%s)
  MMOE_SEED=1342607946089217 CK_RUN_CASE=flash OPENBLAS_NUM_THREADS=16 timeout 300 ./tests/test_gpu_forward \
    > "$OUT/test-flash-seed.log" 2>&1
  echo "test_gpu_forward (flash, seed 1342607946089217): rc=$? ($(( $(date +%s) - t0 )) s)"
  grep -E ":[FE]:|Checks" "$OUT/test-flash-seed.log" | tail -n 5;;
esac
case " $STEPS " in *" profile "*)
  if [ -d "$FLASH" ] && command -v ncu > /dev/null; then
    # 13 tokens one per call: the last call is the decode step at position 12 (no ratio-4 block ends there)
    timeout 240 ncu --clock-control none --metrics gpu__time_duration.sum --csv ./megamoe logits --model "$FLASH" \
      --ids "$(seq -s, 1 13)" --decode --last --cuda-graph off --backend gpu --out "$OUT/profile.safetensors" \
      > "$OUT/ncu-decode.csv" 2> "$OUT/ncu-decode.err"
    python3 tools/ncu_step.py "$OUT/ncu-decode.csv" > "$OUT/decode-step-profile.txt" 2>&1
    echo "profile: rc=$?"; tail -n 30 "$OUT/decode-step-profile.txt"
    rm -f "$OUT/profile.safetensors"
  else echo "profile: no V4-Flash-width checkpoint (run the flash step first) or no ncu"; fi;;
esac
case " $STEPS " in *" profile-tc "*)
  if [ -d "$FLASH" ] && command -v ncu > /dev/null; then
    # the tc recipe's FP8 linears of the first decode step, every section, then where its warps stall
    MMOE_GPU_FP8_LINEARS=tc timeout 300 ncu --set full -k regex:k_linear_fp8_tc -c 3 -f -o "$OUT/tc" ./megamoe logits \
      --model "$FLASH" --ids 1,2,3 --decode --last --cuda-graph off --backend gpu --out "$OUT/p.safetensors" \
      > "$OUT/ncu-tc.log" 2>&1
    echo "profile-tc: rc=$?"; rm -f "$OUT/p.safetensors"
    ncu --import "$OUT/tc.ncu-rep" --page source --print-source sass --csv > "$OUT/tc-sass.csv" 2> "$OUT/tc-sass.err"
    python3 tools/ncu_sass_stalls.py "$OUT/tc-sass.csv" > "$OUT/tc-stalls.txt" 2>&1
    echo "tc stalls: rc=$?"; head -n 50 "$OUT/tc-stalls.txt"
  else echo "profile-tc: no V4-Flash-width checkpoint (run the flash step first) or no ncu"; fi;;
esac
case " $STEPS " in *" break "*)
  # the .cu rules do not track header dependencies: touch the sources so that a patch to a
  # header alone is rebuilt too
  if [ -f "${BREAK_PATCH:-}" ] && patch -p1 < "$BREAK_PATCH" > "$OUT/break.log" 2>&1 \
     && touch src/gpu/*.cu && make -j16 tests/test_gpu_forward tests/test_gpu_forward_blocks >> "$OUT/break.log" 2>&1; then
    timeout 60 ./tests/test_gpu_forward_blocks > "$OUT/break-blocks.log" 2>&1
    echo "broken build, test_gpu_forward_blocks: rc=$? (must fail)"; grep -E ":[FE]:|Checks" "$OUT/break-blocks.log"
    CK_RUN_CASE=sublayers timeout 60 ./tests/test_gpu_forward > "$OUT/break-fwd.log" 2>&1
    echo "broken build, test_gpu_forward sublayers: rc=$? (must fail)"; grep -E ":[FE]:|Checks" "$OUT/break-fwd.log"
    CK_RUN_CASE=tiny timeout 60 ./tests/test_gpu_forward > "$OUT/break-fwd2.log" 2>&1
    echo "broken build, test_gpu_forward tiny: rc=$? (must fail)"; grep -E ":[FE]:|Checks" "$OUT/break-fwd2.log"
  else echo "break: no patch or it did not apply/build"; tail -5 "$OUT/break.log"; fi;;
esac
case " $STEPS " in *" bench "*)
  for graph in off on; do # the decode step launched kernel by kernel, then as one CUDA graph replay
    timeout 60 ./megamoe bench forward --model fixtures/tiny-dsv4 --prefill 64 --decode 32 --backend gpu \
      --cuda-graph $graph > "$OUT/bench-tiny-graph-$graph.log" 2>&1
    echo "bench tiny (--cuda-graph $graph): rc=$?"; grep -vE "^ +[0-9]+ " "$OUT/bench-tiny-graph-$graph.log" | head -30
    if [ -d "$FLASH" ]; then
      timeout 120 ./megamoe bench forward --model "$FLASH" --prefill 64 --decode 16 --backend gpu \
        --cuda-graph $graph > "$OUT/bench-flash-graph-$graph.log" 2>&1
      echo "bench v4-flash widths (--cuda-graph $graph): rc=$?"; head -60 "$OUT/bench-flash-graph-$graph.log"
    fi
  done;;
esac
