# tools/gpu-env.sh: source this on the GPU machine (Ubuntu, no Check there) before configure.
# Unpacks the .deb files carried in $MMOE_DEBS (default .gpu/debs: check, libsubunit,
# libmicrohttpd12 and libmicrohttpd-dev, and jansson/pcre2 in case they are missing) into
# $MMOE_PREFIX and points pkg-config, the compiler and the loader at it.  The .pc files are rewritten to the prefix (rather than using
# PKG_CONFIG_SYSROOT_DIR, which would also re-root the system's own openblas.pc).
MMOE_DEBS=${MMOE_DEBS:-$PWD/.gpu/debs}
test -d "$MMOE_DEBS" || echo "gpu-env: no .deb folder at $MMOE_DEBS" >&2
MMOE_PREFIX=${MMOE_PREFIX:-/tmp/mmoe-prefix}
mkdir -p "$MMOE_PREFIX"
for deb in "$MMOE_DEBS"/*.deb; do
  test -f "$deb" || continue
  pkg=$(basename "$deb" | cut -d_ -f1)
  case $pkg in
    libjansson*) pkg-config --exists jansson 2>/dev/null && continue ;;
    libpcre2*) pkg-config --exists libpcre2-8 2>/dev/null && continue ;;
  esac
  dpkg -x "$deb" "$MMOE_PREFIX"
done
for pc in $(find "$MMOE_PREFIX" -name '*.pc' 2>/dev/null); do
  sed -i "s|^prefix=/usr|prefix=$MMOE_PREFIX/usr|" "$pc"
done
# libmicrohttpd.pc names gnutls in Requires.private (for static links only); without gnutls.pc
# on the machine pkg-config would refuse libmicrohttpd altogether, so drop that line there.
# The shared library's own dependency (libgnutls.so.30) is part of the base system.
mhd_pc=$(find "$MMOE_PREFIX" -name libmicrohttpd.pc 2>/dev/null | head -n 1)
if test -n "$mhd_pc" && ! pkg-config --exists gnutls 2>/dev/null; then
  sed -i '/^Requires.private:.*gnutls/d' "$mhd_pc"
fi
libdir=$MMOE_PREFIX/usr/lib/x86_64-linux-gnu
export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$libdir${LIBRARY_PATH:+:$LIBRARY_PATH}"
# mmoe_configure_h200: configure the tree in the current directory for the H200 (sm_90a code
# only, no manual), as the GPU machine's scripts build it
mmoe_configure_h200() {
  ./configure --with-cuda --disable-doxygen-doc CUDA_GENCODE="-gencode=arch=compute_90a,code=sm_90a"
}
# mmoe_bench_checkpoint MEGAMOE DIR LAYERS: the synthetic V4-Flash-width checkpoint that the decode
# benchmarks and profiles run (LAYERS layers, 8 experts, a vocabulary of 1024) into DIR
mmoe_bench_checkpoint() {
  "$1" synth-model --shape v4-flash --layers "$3" --experts 8 --vocab 1024 --threads 16 --out "$2"
}
