#!/bin/sh
# tools/gpu-prepare.sh: what a call on the GPU machine carries, made on the development machine.
#   .gpu/debs/            the .deb files that machine lacks (Check, subunit, libmicrohttpd, and
#                         jansson and PCRE2 in case): tools/gpu-env.sh unpacks them there; fetched
#                         once with `apt-get download` (Debian's packages install there as files)
#   .gpu/megamoe.tar.gz   `make dist` of the working tree (configured here: the tarball needs no
#                         autotools on that machine)
#   .gpu/change.patch     with BASE (a commit): `git diff BASE` of the working tree, the change that
#                         tools/gpu-ab.sh measures (its base tree is the tarball with it reversed)
# Usage, from the top of a configured checkout:  sh tools/gpu-prepare.sh [BASE]
# then on the device (the run tool, carrying .gpu):
#   bash tools/gpu-ab.sh .gpu/megamoe.tar.gz .gpu/change.patch [STEPS]   (or tools/gpu-forward-check.sh)
set -eu
top=$(pwd)
test -f configure.ac && test -f Makefile || { echo "gpu-prepare: run it from the top of a configured checkout" >&2; exit 2; }
mkdir -p .gpu/debs
if ! ls .gpu/debs/check_*.deb > /dev/null 2>&1; then
  (cd .gpu/debs && apt-get download check libsubunit0 libsubunit-dev libmicrohttpd12 libmicrohttpd-dev \
    libjansson4 libjansson-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3) \
    || { echo "gpu-prepare: apt-get download failed (.gpu/debs)" >&2; exit 1; }
fi
make dist > .gpu/dist.log 2>&1 || { tail -20 .gpu/dist.log; echo "gpu-prepare: make dist failed" >&2; exit 1; }
tarball=$(ls -t megamoe-*.tar.gz | head -n 1)
cp "$tarball" .gpu/megamoe.tar.gz.tmp && mv .gpu/megamoe.tar.gz.tmp .gpu/megamoe.tar.gz
echo "gpu-prepare: .gpu/megamoe.tar.gz ($tarball of $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' + changes'))"
if [ $# -ge 1 ]; then
  git rev-parse --verify -q "$1^{commit}" > /dev/null || { echo "gpu-prepare: $1 is not a commit" >&2; exit 2; }
  git diff "$1" > .gpu/change.patch.tmp && mv .gpu/change.patch.tmp .gpu/change.patch
  echo "gpu-prepare: .gpu/change.patch (git diff $1: $(grep -c '^diff --git' .gpu/change.patch) files)"
fi
du -sh "$top/.gpu" | sed 's/^/gpu-prepare: carried: /'
