# tests/serve_lib.sh: sourced by the server tests.  serve_start ARGS... starts
# `megamoe serve --port 0 ARGS...` in the background, waits (up to 5 minutes: a loaded
# machine, a sanitizer build) for its "listening on" line and sets $port; the EXIT trap
# always stops it (SIGTERM, then SIGKILL after 30 s) and removes $tmp.  serve_stop stops
# it and checks that it exited with status 0 (a clean shutdown, leak-free under ASan).
bin=${MMOE_BIN:?MMOE_BIN not set}
src=${MMOE_SRCDIR:?MMOE_SRCDIR not set}
model=$src/fixtures/tiny-dsv4
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mmoe-serve.XXXXXX") || exit 99
pid=
serve_cleanup() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null
    n=0; while kill -0 "$pid" 2>/dev/null && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    pid=
  fi
  rm -rf "$tmp"
}
trap serve_cleanup EXIT
trap 'exit 99' INT TERM HUP

serve_start() {
  OPENBLAS_NUM_THREADS=1 "$bin" serve --model "$model" --port 0 "$@" 2>"$tmp/serve.log" &
  pid=$!
  n=0
  while ! grep -q 'listening on' "$tmp/serve.log" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "FAIL: the server exited before listening:"; cat "$tmp/serve.log"; pid=; exit 1
    fi
    n=$((n + 1))
    if [ $n -gt 3000 ]; then echo "FAIL: the server did not listen within 5 minutes"; cat "$tmp/serve.log"; exit 1; fi
    sleep 0.1
  done
  port=$(sed -n 's|.*listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$tmp/serve.log")
  echo "server pid $pid on port $port: $(cat "$tmp/serve.log")"
}

serve_stop() {
  kill "$pid"
  wait "$pid"
  rc=$?
  pid=
  if [ $rc -ne 0 ]; then echo "FAIL: the server exited with status $rc after SIGTERM:"; cat "$tmp/serve.log"; return 1; fi
  echo "ok server stopped cleanly"
}
