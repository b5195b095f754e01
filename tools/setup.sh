#!/bin/sh
# megamoe set-up: install what is missing on Debian (apt-get, pip), configure, build,
# and run the main job on the embedded default.  Safe to run again.
set -eu
cd "$(dirname "$0")/.."
SUDO=; test "$(id -u)" -eq 0 || SUDO=sudo
pkgs="autoconf automake autoconf-archive libtool pkg-config make gcc check libopenblas-dev \
 libjansson-dev libpcre2-dev libmicrohttpd-dev doxygen graphviz python3 python3-pip valgrind"
missing=; for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if test -n "$missing"; then
  echo "setup: installing:$missing"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
# Python modules for the cross-checks (optional: the suites skip without them).
python3 -m pip install -q -r tools/requirements-xval.txt 2>/dev/null || \
  python3 -m pip install -q --break-system-packages -r tools/requirements-xval.txt 2>/dev/null || \
  echo "setup: could not install tools/requirements-xval.txt: the Python cross-checks will be skipped"
test -x configure || autoreconf -fi
test -f Makefile || ./configure
make -j"$(nproc)"
sh tools/main-job.sh
