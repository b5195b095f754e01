#!/bin/bash
# tools/gpu-ab.sh: a change to the GPU forward measured against its base, and checked, in one call
# on the GPU machine (device time is scarce: one call builds, checks, measures and traces).
#
#   bash tools/gpu-ab.sh TARBALL PATCH [STEPS]
#
# TARBALL is `make dist` of the changed tree and PATCH the change (tools/gpu-prepare.sh makes
# both); the "new" tree is the tarball, the "base" tree the tarball with PATCH reversed, so both
# build from the same files but the change.  STEPS (default "build check bench trace"):
#   build     both trees (sm_90a), in parallel: megamoe and the forward suites
#   check     on new: tests/test_gpu_forward_blocks, tests/test_gpu_forward (all cases but the
#             V4-Flash-width one) with the CUDA graph off and on, tests/test_ep_gpu_forward (the
#             forward over one NCCL rank and in-process ranks: the held-expert paths); with
#             AB_CHECK_VARIANTS set, tests/test_gpu_forward again under each AB_VARIANTS entry
#             (a variant that changes kernels must keep the bits too), and with
#             AB_CHECK_VARIANTS=flash its V4-Flash-width case too (about a minute a variant)
#   bench     a synthetic V4-Flash-width checkpoint (AB_LAYERS layers, default 4: every attention
#             type; 8 experts; vocabulary 1024), `megamoe bench forward --prefill AB_PREFILL
#             (512) --decode AB_DECODE (32)` graphed, AB_ROUNDS (3) rounds alternating base, new
#   trace     one more bench of each under tools/kernel_trace.c, and their comparison by kernel
#             (tools/kernel_trace.py --base)
#   flash     on new: the V4-Flash-width case of tests/test_gpu_forward
#   memcheck  on new: compute-sanitizer memcheck of the tiny model's forward, graphed
#   racecheck on new: compute-sanitizer racecheck of the blocks suite
#   break     AB_BREAK (patches on new, space-separated, each a deliberate bug, tried one at a
#             time): the blocks suite and the forward's sub-layer and tiny cases should fail, and
#             with AB_BREAK_FLASH set the V4-Flash-width case (the one whose MoE stages several
#             chunks of x and whose linears have V4's widths)
# AB_VARIANTS: settings of the new tree measured beside it, ';'-separated entries "LABEL
# VAR=VALUE ..": bench also runs the new tree with each entry's environment in every round, and
# trace also traces each (compared with base).  AB_CHECK_ENV ("VAR=VALUE .."): the environment
# of the check, flash and memcheck steps (a setting that those suites should cover).
# Prints one line a result (also in $OUT/summary.txt) and leaves everything in $OUT/ab.tgz (the
# device tool brings back few files).  MMOE_DEBS (default .gpu/debs): see tools/gpu-env.sh.
set -u
OUT=${OUT:-/tmp/mmoe-ab}
mkdir -p "$OUT"
[ $# -ge 2 ] && [ -f "$1" ] && [ -f "$2" ] || { echo "usage: bash tools/gpu-ab.sh TARBALL PATCH [STEPS]" >&2; exit 2; }
TARBALL=$(realpath "$1") PATCH=$(realpath "$2")
STEPS=${3:-build check bench trace}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MMOE_DEBS=${MMOE_DEBS:-$PWD/.gpu/debs}
# shellcheck source=tools/gpu-env.sh
. "$ROOT/tools/gpu-env.sh"
export PATH=/usr/local/cuda/bin:$PATH
W=${AB_WORK:-/tmp/mmoe-ab-trees}
S=$OUT/summary.txt
say() { echo "$*" | tee -a "$S"; }
has() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
say "gpu-ab: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -n 1); $(date -u +%FT%TZ)"

# tree NAME [-R] [PATCH]: the tarball unpacked into $W/NAME, PATCH applied (-R: reversed)
tree() {
  local n=$1; shift
  rm -rf "${W:?}/$n" && mkdir -p "$W/$n" && tar -xzf "$TARBALL" -C "$W/$n" --strip-components=1 || return 1
  [ $# -eq 0 ] || patch -s -d "$W/$n" -p1 "$@" > "$OUT/patch-$n.log" 2>&1
}
# variants: the entries of AB_VARIANTS, one a line ("LABEL VAR=VALUE ..")
variants() { echo "${AB_VARIANTS:-}" | tr ';' '\n' | sed 's/^ *//' | grep -v '^$'; }
# build NAME JOBS: configure for the H200 and build megamoe and the forward suites
build() {
  local t0; t0=$(date +%s)
  ( cd "$W/$1" && mmoe_configure_h200 > "$OUT/configure-$1.log" 2>&1 && make -j"$2" > "$OUT/build-$1.log" 2>&1 \
      && make -j"$2" tests/test_gpu_forward tests/test_gpu_forward_blocks tests/test_ep_gpu_forward >> "$OUT/build-$1.log" 2>&1 ) \
    && say "build $1: ok ($(( $(date +%s) - t0 )) s)" \
    || { say "build $1: FAILED"; tail -n 20 "$OUT/build-$1.log"; return 1; }
}
# check NAME LABEL TIMEOUT CMD..: a suite in a tree; its status, seed and Check's summary (stdin
# /dev/null, as bench's: both run inside the `variants | while read` loops, whose lines they must
# not read)
check() {
  local n=$1 l=$2 to=$3 t0 rc; shift 3; t0=$(date +%s)
  # shellcheck disable=SC2086
  ( cd "$W/$n" && export ${AB_CHECK_ENV:-AB_NO_ENV=1} && MMOE_SRCDIR=$W/$n MMOE_BUILDDIR=$W/$n MMOE_BIN=$W/$n/megamoe CK_VERBOSITY=verbose \
      OPENBLAS_NUM_THREADS=16 timeout "$to" "$@" ) < /dev/null > "$OUT/$n-$l.log" 2>&1
  rc=$?
  say "$n $l: rc=$rc ($(( $(date +%s) - t0 )) s) $(grep -m1 -o 'seed [0-9]*' "$OUT/$n-$l.log") $(grep -E '[0-9]+%: Checks' "$OUT/$n-$l.log" | tail -n 1)"
  grep -E ":[FE]:|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$n-$l.log" | head -n 4 | cut -c1-240 | tee -a "$S"
}
# bench NAME LABEL [PREFIX..]: decode ms/token and prefill tokens/s of the graphed step
bench() {
  local n=$1 l=$2; shift 2
  ( cd "$W/$n" && "$@" timeout 180 ./megamoe bench forward --model "$W/model" --prefill "${AB_PREFILL:-512}" \
      --decode "${AB_DECODE:-32}" --backend gpu --cuda-graph on --json ) < /dev/null > "$OUT/bench-$n-$l.json" 2> "$OUT/bench-$n-$l.err"
  local rc=$?
  if [ $rc -eq 0 ]; then
    say "bench $n $l: $(python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print("decode %.4f ms/token, prefill %.0f tokens/s" % (j["decode_ms_per_token"], j["prefill_tokens_per_s"]))' "$OUT/bench-$n-$l.json" 2>&1 | tail -n 1)"
  else
    say "bench $n $l: FAILED (rc=$rc): $(tail -n 1 "$OUT/bench-$n-$l.err")"
  fi
}

if has build; then
  tree new || { say "cannot unpack $TARBALL"; exit 1; }
  tree base -R -i "$PATCH" || { say "the change does not reverse onto the tarball (patch-base.log)"; exit 1; }
  build new 8 & build base 8 & wait
fi
[ -x "$W/new/megamoe" ] && [ -x "$W/base/megamoe" ] || { say "gpu-ab: the trees are not built"; exit 1; }
if has check; then
  check new blocks 300 ./tests/test_gpu_forward_blocks
  check new forward 300 env CK_EXCLUDE_TAGS=flash ./tests/test_gpu_forward
  check new forward-graph 300 env CK_EXCLUDE_TAGS=flash MMOE_GPU_GRAPH=1 ./tests/test_gpu_forward
  check new ep-forward 300 ./tests/test_ep_gpu_forward
  if [ -n "${AB_CHECK_VARIANTS:-}" ]; then
    # shellcheck disable=SC2086
    variants | while read -r label vars; do
      check new "forward-$label" 300 env CK_EXCLUDE_TAGS=flash $vars ./tests/test_gpu_forward
      [ "$AB_CHECK_VARIANTS" = flash ] && check new "flash-$label" 300 env CK_RUN_CASE=flash $vars ./tests/test_gpu_forward
    done
  fi
fi
if has bench || has trace; then
  [ -d "$W/model" ] || mmoe_bench_checkpoint "$W/new/megamoe" "$W/model" "${AB_LAYERS:-4}" > "$OUT/synth-model.log" 2>&1 \
    || { say "synth-model failed"; exit 1; }
fi
if has bench; then
  for r in $(seq 1 "${AB_ROUNDS:-3}"); do
    bench base "r$r"; bench new "r$r"
    # shellcheck disable=SC2086
    variants | while read -r label vars; do bench new "$label-r$r" env $vars; done
  done
fi
if has trace; then
  cupti=/usr/local/cuda/targets/x86_64-linux/lib
  gcc -std=c11 -O2 -shared -fPIC -I/usr/local/cuda/include -o "$W/libkt.so" "$ROOT/tools/kernel_trace.c" \
    -L"$cupti" -lcupti > "$OUT/kernel-trace-build.log" 2>&1 || say "trace: libkt.so did not build"
  for n in base new; do
    bench "$n" trace env LD_LIBRARY_PATH="$cupti:$LD_LIBRARY_PATH" CUDA_INJECTION64_PATH="$W/libkt.so" \
      MMOE_KERNEL_TRACE="$OUT/trace-$n.csv"
    python3 "$ROOT/tools/kernel_trace.py" "$OUT/trace-$n.csv" > "$OUT/trace-$n.txt" 2>&1
  done
  python3 "$ROOT/tools/kernel_trace.py" "$OUT/trace-new.csv" --base "$OUT/trace-base.csv" > "$OUT/trace-compare.txt" 2>&1
  head -n 26 "$OUT/trace-compare.txt" | tee -a "$S"
  # shellcheck disable=SC2086
  variants | while read -r label vars; do
    bench new "trace-$label" env $vars LD_LIBRARY_PATH="$cupti:$LD_LIBRARY_PATH" CUDA_INJECTION64_PATH="$W/libkt.so" \
      MMOE_KERNEL_TRACE="$OUT/trace-$label.csv"
    python3 "$ROOT/tools/kernel_trace.py" "$OUT/trace-$label.csv" --base "$OUT/trace-base.csv" \
      > "$OUT/trace-compare-$label.txt" 2>&1
    say "trace $label against base:"; head -n 26 "$OUT/trace-compare-$label.txt" | tee -a "$S"
  done
fi
has flash && check new flash 300 env CK_RUN_CASE=flash ./tests/test_gpu_forward
has memcheck && check new memcheck 240 env CK_RUN_CASE=tiny MMOE_GPU_GRAPH=1 \
  compute-sanitizer --tool memcheck --error-exitcode 3 ./tests/test_gpu_forward
has racecheck && check new racecheck 300 compute-sanitizer --tool racecheck --error-exitcode 3 ./tests/test_gpu_forward_blocks
if has break; then
  [ -n "${AB_BREAK:-}" ] || say "break: no AB_BREAK patch"
  for b in ${AB_BREAK:-}; do
    bn=break-$(basename "$b" .patch)
    if [ -f "$b" ] && rm -rf "${W:?}/$bn" && cp -a "$W/new" "$W/$bn" \
       && patch -s -d "$W/$bn" -p1 < "$b" > "$OUT/patch-$bn.log" 2>&1 && touch "$W/$bn"/src/gpu/*.cu \
       && make -C "$W/$bn" -j16 megamoe tests/test_gpu_forward tests/test_gpu_forward_blocks > "$OUT/build-$bn.log" 2>&1; then
      check "$bn" blocks 200 ./tests/test_gpu_forward_blocks
      check "$bn" sublayers 200 env CK_RUN_CASE=sublayers ./tests/test_gpu_forward
      check "$bn" tiny 200 env CK_RUN_CASE=tiny ./tests/test_gpu_forward
      [ -n "${AB_BREAK_FLASH:-}" ] && check "$bn" flash 300 env CK_RUN_CASE=flash ./tests/test_gpu_forward
      say "$bn: each should fail (rc 1); a suite that passes does not cover the bug"
    else say "$bn: the patch did not apply or build"; fi
    rm -rf "${W:?}/$bn"
  done
fi
say "gpu-ab: done $(date -u +%FT%TZ)"
( cd "$OUT" && tar -czf /tmp/mmoe-ab.tgz --exclude=ab.tgz --exclude=summary.txt . && find . -maxdepth 1 -type f \
    ! -name summary.txt -delete && mv /tmp/mmoe-ab.tgz ab.tgz )
