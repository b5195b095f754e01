#!/bin/bash
# tools/gpu-floor.sh: the decode step's kernels against their two floors, in one call on the GPU
# machine.
#
#   bash tools/gpu-floor.sh TARBALL
#
# TARBALL is `make dist` of the tree to measure (tools/gpu-prepare.sh makes .gpu/megamoe.tar.gz).
# It is built for the H200 (sm_90a, megamoe only), a synthetic V4-Flash-width checkpoint is made
# (FLOOR_LAYERS layers, default 4: every attention type; 8 experts; vocabulary 1024), and:
#   bench    `megamoe bench forward --prefill 512 --decode 32` graphed, FLOOR_ROUNDS (3) rounds, and
#            in each round every FLOOR_VARIANTS entry ("LABEL VAR=VALUE ..", ';'-separated)
#   trace    the same under tools/kernel_trace.c: every kernel's exposed time in the graphed step
#            (and each variant's, compared with it)
#   census   the same model's eager decode steps under Nsight Compute with four counters a kernel
#            (duration, warp instructions issued, DRAM bytes read and written; kernels
#            serialized, caches flushed, clocks as ncu sets them)
#   probe    tools/stream_probe.cu: the read rate of a cold 512 MB read, and the layer's eight
#            weight streams as eight launches and as one
# tools/ncu_floor.py then joins the census's last decode step with the trace: for every kernel
# its exposed time, its warp instructions at the SMs' full issue rate (4 a cycle an SM at the
# maximum SM clock) and its DRAM bytes at the probe's read rate.  $OUT gets summary.txt, probe.txt,
# trace.txt and the table floor.txt as they are made, and floor.tgz (every log, the census, the
# traces) at the end.  MMOE_DEBS: see tools/gpu-env.sh.
set -u
OUT=${OUT:-/tmp/mmoe-floor}
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: bash tools/gpu-floor.sh TARBALL" >&2; exit 2; }
TARBALL=$(realpath "$1")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MMOE_DEBS=${MMOE_DEBS:-$PWD/.gpu/debs}
# shellcheck source=tools/gpu-env.sh
. "$ROOT/tools/gpu-env.sh"
export PATH=/usr/local/cuda/bin:$PATH
W=${FLOOR_WORK:-/tmp/mmoe-floor-tree}
P=$W/floor
mkdir -p "$OUT"
rm -rf "$W" && mkdir -p "$P" "$W/tree"
# the summary, the probe's and the table's text land in $OUT as they are made (they come back
# even if the call is cut short); the logs go into $OUT/floor.tgz at the end
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
say "gpu-floor: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -n 1); $(date -u +%FT%TZ)"
tar -xzf "$TARBALL" -C "$W/tree" --strip-components=1 || { say "cannot unpack $TARBALL"; exit 1; }
cd "$W/tree" || exit 1
# the build on the CPUs (at the lowest priority, so that the probe's launches are not held up)
# while the probe runs on the GPU
( mmoe_configure_h200 > "$P/configure.log" 2>&1 && nice -n 19 make -j16 megamoe > "$P/build.log" 2>&1 ) &
builder=$!
nvcc -std=c++17 -O3 -arch=sm_90a -o "$W/stream_probe" "$ROOT/tools/stream_probe.cu" -lcuda > "$P/probe-build.log" 2>&1 \
  && timeout 150 "$W/stream_probe" > "$OUT/probe.txt" 2>&1
say "probe: rc=$? $(grep -E '^ldg (512 MB|.*(eight|one read|cooperative))' "$OUT/probe.txt" | tr '\n' ';')"
wait "$builder" || { say "build failed"; tail -n 20 "$P/build.log"; exit 1; }
mmoe_bench_checkpoint ./megamoe "$W/model" "${FLOOR_LAYERS:-4}" > "$P/synth-model.log" 2>&1 || { say "synth-model failed"; exit 1; }
bench() {
  local l=$1; shift
  "$@" timeout 180 ./megamoe bench forward --model "$W/model" --prefill 512 --decode 32 --backend gpu \
    --cuda-graph on --json < /dev/null > "$P/bench-$l.json" 2> "$P/bench-$l.err"
  say "bench $l: rc=$? $(python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print("decode %.4f ms/token, prefill %.0f tokens/s" % (j["decode_ms_per_token"], j["prefill_tokens_per_s"]))' "$P/bench-$l.json" 2>&1 | tail -n 1)"
}
# FLOOR_VARIANTS: ';'-separated "LABEL VAR=VALUE .." settings benched in the same rounds and traced
variants() { echo "${FLOOR_VARIANTS:-}" | tr ';' '\n' | sed 's/^ *//' | grep -v '^$'; }
for r in $(seq 1 "${FLOOR_ROUNDS:-3}"); do
  bench "r$r"
  # shellcheck disable=SC2086
  variants | while read -r label vars; do bench "$label-r$r" env $vars; done
done
cupti=/usr/local/cuda/targets/x86_64-linux/lib
gcc -std=c11 -O2 -shared -fPIC -I/usr/local/cuda/include -o "$W/libkt.so" "$ROOT/tools/kernel_trace.c" \
  -L"$cupti" -lcupti > "$P/kernel-trace-build.log" 2>&1 || say "trace: libkt.so did not build"
bench trace env LD_LIBRARY_PATH="$cupti:${LD_LIBRARY_PATH:-}" CUDA_INJECTION64_PATH="$W/libkt.so" MMOE_KERNEL_TRACE="$P/trace.csv"
python3 "$ROOT/tools/kernel_trace.py" "$P/trace.csv" > "$OUT/trace.txt" 2>&1
python3 "$ROOT/tools/kernel_trace.py" "$P/trace.csv" --json > "$P/trace.json" 2>&1
# shellcheck disable=SC2086
variants | while read -r label vars; do
  bench "trace-$label" env $vars LD_LIBRARY_PATH="$cupti:${LD_LIBRARY_PATH:-}" CUDA_INJECTION64_PATH="$W/libkt.so" \
    MMOE_KERNEL_TRACE="$P/trace-$label.csv"
  python3 "$ROOT/tools/kernel_trace.py" "$P/trace-$label.csv" --base "$P/trace.csv" > "$P/trace-$label.txt" 2>&1
  head -n 30 "$P/trace-$label.txt"
done
t0=$(date +%s)
timeout 300 ncu --csv --print-units base --kernel-name-base demangled \
  --metrics gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  ./megamoe bench forward --model "$W/model" --prefill 512 --decode 2 --backend gpu --cuda-graph off \
  < /dev/null > "$P/census.csv" 2> "$P/census.err"
say "census: rc=$? ($(( $(date +%s) - t0 )) s)"
bw=$(awk '/^ldg 512 MB/ { print $(NF - 1) }' "$OUT/probe.txt")
sms=$(python3 -c 'import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)' 2>/dev/null || echo 132)
mhz=$(nvidia-smi --query-gpu=clocks.max.sm --format=csv,noheader,nounits | head -n 1)
python3 "$ROOT/tools/ncu_floor.py" "$P/census.csv" --trace "$P/trace.json" --layers "${FLOOR_LAYERS:-4}" \
  --sms "$sms" --mhz "$mhz" --tbs "${bw:-4.0}" > "$OUT/floor.txt" 2>&1
cat "$OUT/floor.txt"
cp "$OUT"/*.txt "$P/"
cd "$W" && tar -czf "$OUT/floor.tgz" floor
