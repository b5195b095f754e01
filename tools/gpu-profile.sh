#!/bin/bash
# tools/gpu-profile.sh: Nsight Compute profiles of the decode step's kernels, one call on the GPU
# machine.
#
#   bash tools/gpu-profile.sh TARBALL 'NAME:REGEX:SKIP:COUNT ..'
#
# TARBALL is `make dist` of the tree to profile (tools/gpu-prepare.sh makes .gpu/megamoe.tar.gz);
# it is built for the H200 (sm_90a, megamoe only) and a synthetic V4-Flash-width checkpoint is
# made (PROF_LAYERS layers, default 4: every attention type; 8 experts; vocabulary 1024).  Each
# spec profiles COUNT launches, after SKIP, of the kernels whose demangled name matches REGEX
# (ncu --set full, kernels serialized, clocks as ncu sets them) in `megamoe bench forward
# --prefill PROF_PREFILL (default 64) --decode 3 --cuda-graph off`: the prefill's call, then
# eager decode steps, so a one-token kernel's SKIP counts its launches of the first step.  Write the regex
# without spaces (ncu matches "k_moe_l1<(int)4, (int)1>" by 'k_moe_l1<.int.4,..int.1>').  For
# each NAME: NAME.ncu-rep, NAME-details.txt (the details page) and NAME-src.csv (the SASS source
# page, which tools/ncu_sass_stalls.py and tools/ncu_sass_mix.py read), all in $OUT/prof.tgz
# with the logs; the details' headline counters are printed.  MMOE_DEBS: see tools/gpu-env.sh.
set -u
OUT=${OUT:-/tmp/mmoe-prof}
[ $# -eq 2 ] && [ -f "$1" ] || { echo "usage: bash tools/gpu-profile.sh TARBALL 'NAME:REGEX:SKIP:COUNT ..'" >&2; exit 2; }
TARBALL=$(realpath "$1") SPECS=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MMOE_DEBS=${MMOE_DEBS:-$PWD/.gpu/debs}
# shellcheck source=tools/gpu-env.sh
. "$ROOT/tools/gpu-env.sh"
export PATH=/usr/local/cuda/bin:$PATH
P=$OUT/prof
W=${PROF_WORK:-/tmp/mmoe-prof-tree}
mkdir -p "$P"
rm -rf "$W" && mkdir -p "$W/tree" && tar -xzf "$TARBALL" -C "$W/tree" --strip-components=1 || { echo "cannot unpack $TARBALL"; exit 1; }
cd "$W/tree" || exit 1
mmoe_configure_h200 > "$P/configure.log" 2>&1 && make -j16 megamoe > "$P/build.log" 2>&1 || { echo "build failed"; tail -n 20 "$P/build.log"; exit 1; }
mmoe_bench_checkpoint ./megamoe "$W/model" "${PROF_LAYERS:-4}" > "$P/synth-model.log" 2>&1 || { echo "synth-model failed"; exit 1; }
for spec in $SPECS; do
  IFS=: read -r name regex skip count <<< "$spec"
  timeout 240 ncu --set full --kernel-name-base demangled -k "regex:$regex" --launch-skip "$skip" --launch-count "$count" \
    -o "$P/$name" ./megamoe bench forward --model "$W/model" --prefill "${PROF_PREFILL:-64}" --decode 3 --backend gpu --cuda-graph off \
    > "$P/ncu-$name.log" 2>&1
  echo "ncu $name: rc=$?"
  ncu --import "$P/$name.ncu-rep" --page details > "$P/$name-details.txt" 2>&1
  ncu --import "$P/$name.ncu-rep" --page source --print-source sass --csv > "$P/$name-src.csv" 2>&1
  grep -E "^  [a-z_]|Duration|DRAM Throughput|Issue Slots Busy|Executed Ipc Active|Registers Per|Achieved Occupancy|Executed Instructions  " \
    "$P/$name-details.txt" | head -n 24
done
cd "$OUT" && tar -czf prof.tgz prof && rm -rf prof
