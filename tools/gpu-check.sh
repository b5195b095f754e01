#!/bin/bash
# tools/gpu-check.sh: everything the GPU machine does in one call (device time is scarce).
#   1. build this unpacked dist tree with CUDA (sm_90a + sm_100a);
#   2. run the GPU suite (tests/test_gpu_moe) against the CPU oracle;
#   3. compute-sanitizer memcheck on a small case (when the tool can see the device);
#   4. the benchmark with the PyTorch peer (table in bench.log, JSON lines in bench.jsonl);
#   5. the whole GPU forward (step "forward"): its suites (also with the CUDA graph on), then
#      `megamoe bench forward` with the decode step's CUDA graph off and on (JSON lines in
#      bench-forward.jsonl).
# Logs go to $OUT (the device tool brings them back).  Usage, on the device machine, from the
# checkout that carries .gpu/ (the tarball of `make dist` and the .deb files):
#   mkdir /tmp/m && tar -xzf .gpu/megamoe-*.tar.gz -C /tmp/m --strip-components=1 &&
#   MMOE_DEBS=$PWD/.gpu/debs bash /tmp/m/tools/gpu-check.sh [STEPS]
# with STEPS a subset of "build test memcheck bench forward profile tiles ep"
# (default: build test memcheck bench forward).
#   ep: expert parallelism on every GPU of the machine (tests/test_ep_gpu, bench moe --gpus N).
# MMOE_GEMMS (default "auto mma wgmma decode16") names the kernel families that test and memcheck run.
set -u
OUT=${OUT:-/tmp/mmoe-out}
mkdir -p "$OUT"
STEPS=${1:-build test memcheck bench forward}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tools/gpu-env.sh
. "$ROOT/tools/gpu-env.sh"
export PATH=/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BUILD=$ROOT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
case " $STEPS " in *" build "*)
  ( cd "$BUILD" && ./configure --with-cuda --disable-doxygen-doc PYTHON3=$(command -v python3) > "$OUT/configure.log" 2>&1 \
    && make -j16 > "$OUT/build.log" 2>&1 && make -j16 tests/test_gpu_moe tests/bench_moe_gpu > "$OUT/build-check.log" 2>&1 ) \
    || { echo "BUILD FAILED"; tail -n 40 "$OUT"/configure.log "$OUT"/build.log "$OUT"/build-check.log; exit 1; }
  echo "build: ok";;
esac
cd "$BUILD" || exit 1
export MMOE_SRCDIR=$BUILD MMOE_BUILDDIR=$BUILD CK_VERBOSITY=normal
case " $STEPS " in *" ep "*)
  # expert parallelism: the NCCL exchange and the EP layer on all GPUs, then the EP benchmark
  make -j16 tests/test_ep_gpu > "$OUT/build-ep.log" 2>&1 || { echo "ep build failed"; tail -n 20 "$OUT/build-ep.log"; }
  CK_VERBOSITY=verbose timeout 300 ./tests/test_ep_gpu > "$OUT/test_ep_gpu.log" 2>&1
  echo "test_ep_gpu: rc=$?"
  grep -E "GPUs used|nccl exchange|rel L2|differ|[0-9]+%: Checks|:[PFE]:" "$OUT/test_ep_gpu.log" | tail -n 70
  n_gpus=$(nvidia-smi -L | wc -l)
  timeout 300 ./megamoe bench moe --gpus "$n_gpus" --shape v4-flash --tokens 1,2,8,64,512 --reps 10 \
    > "$OUT/bench-ep.log" 2>&1
  echo "bench moe --gpus $n_gpus: rc=$?"; cat "$OUT/bench-ep.log";;
esac
case " $STEPS " in *" test "*)
  # the suite once per GEMM kernel family (auto: the per-call choice users get), each forced family too
  for gemm in ${MMOE_GEMMS:-auto mma wgmma decode16}; do
    log="$OUT/test_gpu_moe-$gemm.log"
    MMOE_GPU_GEMM=$gemm CK_VERBOSITY=verbose timeout 300 ./tests/test_gpu_moe > "$log" 2>&1; rc=$?
    echo "test_gpu_moe (MMOE_GPU_GEMM=$gemm): rc=$rc"
    if [ $rc -ge 128 ] && command -v cuda-gdb > /dev/null; then
      MMOE_GPU_GEMM=$gemm CK_VERBOSITY=verbose timeout 200 cuda-gdb -batch -ex run -ex bt ./tests/test_gpu_moe > "$OUT/gdb-$gemm.log" 2>&1
      grep -A12 "signal" "$OUT/gdb-$gemm.log" | head -30
    fi
    grep -E "^case|rel L2|[0-9]+%: Checks|:[PFE]:|error" "$log" | tail -n 40
  done;;
esac
case " $STEPS " in *" memcheck "*)
  if command -v compute-sanitizer > /dev/null; then
    # decode16: T <= 4 runs the 3-launch pipeline (the GEMMs requantize and combine), 40 the 5-launch one
    for gemm in ${MMOE_GEMMS:-auto mma wgmma decode16}; do
      timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 ./tests/bench_moe_gpu --shape tiny --tokens 1,40,300 \
        --iters 2 --gemm "$gemm" --peer none > "$OUT/memcheck-$gemm.log" 2>&1
      echo "memcheck ($gemm): rc=$?"; tail -n 6 "$OUT/memcheck-$gemm.log"
      timeout 120 compute-sanitizer --tool racecheck --error-exitcode 3 ./tests/bench_moe_gpu --shape tiny --tokens 2,40 \
        --iters 1 --gemm "$gemm" --peer none > "$OUT/racecheck-$gemm.log" 2>&1
      echo "racecheck ($gemm): rc=$?"; tail -n 4 "$OUT/racecheck-$gemm.log"
    done
  else echo "memcheck: compute-sanitizer not found"; fi;;
esac
case " $STEPS " in *" profile "*)
  # Nsight Compute on the routed L1 GEMM of each family (MMOE_PROFILE_T, default 128 and 8192)
  for t in ${MMOE_PROFILE_T:-128 8192}; do
    for g in ${MMOE_GEMMS:-mma wgmma decode16}; do
      case $g in
        mma) k="regex:gemm_kernel<.*int.0, .int.128, .int.0>";;
        decode16) k="regex:decode16_gemm_kernel<.int.128, .int.0>";;
        *) k="regex:wgmma_gemm_kernel<.*int.0, .int.128, .int.0>";;
      esac
      timeout 200 ncu --clock-control none --kernel-name-base demangled --kernel-name "$k" --launch-skip 2 \
        --launch-count 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section SchedulerStats ./tests/bench_moe_gpu --shape v4-flash --tokens "$t" --iters 1 --gemm "$g" --peer none \
        > "$OUT/ncu-$g-$t.log" 2>&1; echo "ncu $g T=$t: rc=$?"
      grep -E "wgmma_gemm_kernel|gemm_kernel|Duration|DRAM Throughput|DRAM Bandwidth|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Issue Slots Busy|No Eligible|Registers Per" "$OUT/ncu-$g-$t.log" | head -14
    done
  done;;
esac
case " $STEPS " in *" bench "*)
  # MMOE_BENCH_ARGS: extra options (e.g. "--gemm mma" or "--peer none")
  # shellcheck disable=SC2086
  PYTHON3=python3 PYTHONUNBUFFERED=1 timeout ${MMOE_BENCH_TIMEOUT:-300} ./tests/bench_moe_gpu --shape v4-flash \
    --tokens ${MMOE_BENCH_TOKENS:-1,8,32,128,512,2048,8192} --iters ${MMOE_BENCH_ITERS:-50} \
    --peer "$BUILD/bench/torch_peer.py" --json ${MMOE_BENCH_ARGS:-} > "$OUT/bench.jsonl" 2> "$OUT/bench.log"
  echo "bench: rc=$?"
  cat "$OUT/bench.log";;
esac
case " $STEPS " in *" forward "*)
  # the GPU forward: blocks, whole model (its V4-Flash-width checkpoint kept in $FLASH), the
  # expert-parallel forward; then the suites again with MMOE_GPU_GRAPH=1 (every whole-model GPU
  # model replays its decode steps as one CUDA graph: decode must still equal the GPU prefill
  # and the unsplit model the expert-parallel one, bit for bit; the CLI cases run graphed too)
  FLASH=${MMOE_FLASH_DIR:-/tmp/mmoe-flash}
  make -j16 tests/test_gpu_forward tests/test_gpu_forward_blocks tests/test_ep_gpu_forward \
    > "$OUT/build-forward.log" 2>&1 || { echo "forward build failed"; tail -n 20 "$OUT/build-forward.log"; }
  export MMOE_BIN=$BUILD/megamoe
  CK_VERBOSITY=verbose timeout 200 ./tests/test_gpu_forward_blocks > "$OUT/test_gpu_forward_blocks.log" 2>&1
  echo "test_gpu_forward_blocks: rc=$?"; grep -E "[0-9]+%: Checks|:[FE]:" "$OUT/test_gpu_forward_blocks.log" | tail -n 10
  CK_VERBOSITY=verbose MMOE_GPU_FWD_FLASH_DIR=$FLASH OPENBLAS_NUM_THREADS=16 timeout 600 ./tests/test_gpu_forward \
    > "$OUT/test_gpu_forward.log" 2>&1
  echo "test_gpu_forward (graphs off; cuda_graph case on/off): rc=$?"
  grep -E "cuda graph|[0-9]+%: Checks|:[FE]:" "$OUT/test_gpu_forward.log" | tail -n 12
  CK_VERBOSITY=verbose CK_EXCLUDE_TAGS=flash MMOE_GPU_GRAPH=1 OPENBLAS_NUM_THREADS=16 timeout 400 ./tests/test_gpu_forward \
    > "$OUT/test_gpu_forward-graph.log" 2>&1
  echo "test_gpu_forward (MMOE_GPU_GRAPH=1): rc=$?"
  grep -E "gpu decode vs|[0-9]+%: Checks|:[FE]:" "$OUT/test_gpu_forward-graph.log" | tail -n 12
  # (the expert-parallel ranks run kernel by kernel: MMOE_GPU_GRAPH=1 is refused there by design)
  CK_VERBOSITY=verbose timeout 300 ./tests/test_ep_gpu_forward > "$OUT/test_ep_gpu_forward.log" 2>&1
  echo "test_ep_gpu_forward: rc=$?"
  grep -E "[0-9]+%: Checks|:[FE]:" "$OUT/test_ep_gpu_forward.log" | tail -n 6
  # decode ms/token with the graph off and on (the totals unsynchronized; splits synchronized, always eager)
  : > "$OUT/bench-forward.jsonl"
  for model in fixtures/tiny-dsv4 "$FLASH"; do
    [ -d "$model" ] || { echo "bench forward: $model missing (the flash case did not keep it)"; continue; }
    for graph in off on; do
      timeout 200 ./megamoe bench forward --model "$model" --prefill 64 --decode 32 \
        --backend gpu --cuda-graph $graph --json >> "$OUT/bench-forward.jsonl" 2>> "$OUT/bench-forward.err"
      echo "bench forward $model, --cuda-graph $graph: rc=$?"
    done
  done
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    print("%-32s cuda_graph %-5s replays %3d  prefill %9.1f tokens/s  decode %.4f ms/token" % (o["model"][-32:],
          o["cuda_graph"], o["cuda_graph_replays"], o["prefill_tokens_per_s"], o["decode_ms_per_token"]))' \
    "$OUT/bench-forward.jsonl"
  tail -n 5 "$OUT/bench-forward.err";;
esac
case " $STEPS " in *" tiles "*)
  # every tile height of each kernel family over the token counts, no peer (an A/B in one call)
  for spec in ${MMOE_TILES:-mma:16 mma:64 wgmma:16 wgmma:64 wgmma:128}; do
    g=${spec%%:*}; bm=${spec#*:}
    timeout 120 ./tests/bench_moe_gpu --shape v4-flash --tokens ${MMOE_TILE_TOKENS:-1,32,128,512,2048,8192} --iters 10 \
      --gemm "$g" --block-m "$bm" --peer none > "$OUT/tiles-$g-$bm.log" 2>&1
    echo "gemm $g block_m $bm: rc=$?"; grep "^T=" "$OUT/tiles-$g-$bm.log"
  done;;
esac
