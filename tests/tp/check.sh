#!/bin/bash
# Runs one command of the tensor-parallel suite and judges its outcome:
#   check.sh verify BOUND_REF BOUND_SINGLE -- CMD...
#     CMD must succeed and print the tp summary; its verify line's max |diff|
#     against the scalar reference must be at most BOUND_REF, and against the
#     single-process run at most BOUND_SINGLE.
#   check.sh fail RC PATTERN -- CMD...
#     CMD must exit with RC ("nonzero": any failure) and print a line
#     matching the extended regex PATTERN (stdout and stderr together).
#   check.sh ok PATTERN -- CMD...
#     CMD must succeed and print a line matching PATTERN.
# CTest's TIMEOUT bounds every call, so a hung job fails instead of waiting.
set -u
mode=$1; shift
case $mode in
  verify) bound_ref=$1 bound_single=$2; shift 2 ;;
  fail) want_rc=$1 pattern=$2; shift 2 ;;
  ok) pattern=$1; shift ;;
  *) echo "check.sh: unknown mode $mode"; exit 1 ;;
esac
[ "$1" = "--" ] || { echo "check.sh: expected -- before the command"; exit 1; }
shift
out=$("$@" 2>&1)
rc=$?
echo "$out"
echo "exit code: $rc"
case $mode in
  verify)
    [ $rc -eq 0 ] || { echo "FAIL: exit code $rc, wanted 0"; exit 1; }
    grep -q '^KV memory per rank' <<<"$out" || { echo "FAIL: no per-rank KV memory line"; exit 1; }
    grep -q '^all-reduce: ' <<<"$out" || { echo "FAIL: no all-reduce line"; exit 1; }
    line=$(grep '^verify: ' <<<"$out")
    [ -n "$line" ] || { echo "FAIL: no verify line"; exit 1; }
    ref=$(sed -E 's/.*scalar reference ([^ ]+) .*/\1/' <<<"$line")
    single=$(sed -E 's/.*single-process run ([^ ]+)$/\1/' <<<"$line")
    awk -v r="$ref" -v s="$single" -v br="$bound_ref" -v bs="$bound_single" \
      'BEGIN { ok = (r + 0 == r && s + 0 == s && r <= br + 0 && s <= bs + 0); exit ok ? 0 : 1 }' ||
      { echo "FAIL: max |diff| $ref vs reference (bound $bound_ref), $single vs single process (bound $bound_single)"; exit 1; }
    echo "PASS: max |diff| $ref vs reference (bound $bound_ref), $single vs single process (bound $bound_single)" ;;
  fail)
    if [ "$want_rc" = nonzero ]; then
      [ $rc -ne 0 ] || { echo "FAIL: exit code 0, wanted a failure"; exit 1; }
    else
      [ $rc -eq "$want_rc" ] || { echo "FAIL: exit code $rc, wanted $want_rc"; exit 1; }
    fi
    grep -Eq -- "$pattern" <<<"$out" || { echo "FAIL: no line matches: $pattern"; exit 1; }
    echo "PASS" ;;
  ok)
    [ $rc -eq 0 ] || { echo "FAIL: exit code $rc, wanted 0"; exit 1; }
    grep -Eq -- "$pattern" <<<"$out" || { echo "FAIL: no line matches: $pattern"; exit 1; }
    echo "PASS" ;;
esac
