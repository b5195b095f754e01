#!/bin/sh
# Print the Check summary line of every suite run by the last `make check`, then a
# total in Check's own format ("100%: Checks: N, Failures: F, Errors: E"), and the
# skipped suites.  usage: check-summary.sh BUILDDIR
dir=${1:-.}
logs=$(find "$dir/tests" -name '*.log' ! -name test-suite.log 2>/dev/null | sort)
total=0; fail=0; errs=0
for log in $logs; do
  line=$(grep -E '^[0-9]+%: Checks: [0-9]+' "$log" | tail -n 1)
  name=$(basename "$log" .log)
  if test -n "$line"; then
    echo "  $name: $line"
    n=$(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
    f=$(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
    e=$(echo "$line" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
    total=$((total + n)); fail=$((fail + f)); errs=$((errs + e))
  else
    trs=${log%.log}.trs
    result=$(sed -n 's/^:test-result: //p' "$trs" 2>/dev/null | head -n 1)
    case $result in
      SKIP) echo "  $name: SKIP ($(grep -m1 -i 'skip' "$log" | head -c 120))" ;;
      PASS) echo "  $name: PASS (script test)" ;;
      "") ;;
      *) echo "  $name: $result (script test)"; fail=$((fail + 1)) ;;
    esac
  fi
done
if test "$total" -eq 0; then
  echo "check-summary: no Check results found under $dir/tests" >&2
  exit 1
fi
pct=$(( (total - fail - errs) * 100 / total ))
echo "$pct%: Checks: $total, Failures: $fail, Errors: $errs"
test "$fail" -eq 0 && test "$errs" -eq 0
