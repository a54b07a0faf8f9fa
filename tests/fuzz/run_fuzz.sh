#!/usr/bin/env bash
# Runs each libFuzzer harness of a G3ATTN_FUZZ=ON build for a bounded time.
#
#   tests/fuzz/run_fuzz.sh BUILD_DIR [SECONDS_PER_HARNESS] [HARNESS...]
#
# BUILD_DIR was configured with CC=clang CXX=clang++ -DG3ATTN_FUZZ=ON and the
# target fuzz_all built (./test.sh does both). Each harness starts from the
# checked-in seeds (corpus/<h>/) and past crash inputs (regressions/<h>/), and
# grows a working corpus under BUILD_DIR/fuzz-work/<h>/corpus, so the checked-in
# seeds never change behind your back. A crash, a sanitizer report, a hang
# (-timeout per input) or a memory blow-up (-rss_limit_mb, -malloc_limit_mb)
# stops the harness and leaves the input in BUILD_DIR/fuzz-work/<h>/; the
# script then fails and prints how to turn it into a named regression input.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: run_fuzz.sh BUILD_DIR [SECONDS] [HARNESS...]}
seconds=${2:-30}
shift $(( $# >= 2 ? 2 : 1 ))
harnesses=("$@")
((${#harnesses[@]})) || harnesses=(npy safetensors config)

# Inputs up to 64 KiB reach every header-size branch (npy 1.0 headers stop at
# 64 KiB) and deep JSON nesting; a parser of small files that needs more than
# 10 s for one input is hung, and more than 2 GiB is a memory amplification bug.
max_len=65536
status=0
for h in "${harnesses[@]}"; do
  bin="$build/tests/fuzz/fuzz_$h"
  [[ -x $bin ]] || { echo "run_fuzz: $bin is missing (configure with -DG3ATTN_FUZZ=ON, build fuzz_all)" >&2; exit 2; }
  work="$build/fuzz-work/$h"
  mkdir -p "$work/corpus"
  log="$work/fuzz.log"
  echo "run_fuzz: fuzz_$h for ${seconds}s (log $log)"
  set +e
  "$bin" "$work/corpus" "$here/corpus/$h" "$here/regressions/$h" \
    -dict="$here/$h.dict" -max_total_time="$seconds" -max_len="$max_len" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -artifact_prefix="$work/" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo "?")
  cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 || true)
  if ((rc == 0)); then
    echo "run_fuzz: fuzz_$h: $runs executions, $cov, no crash"
  else
    status=1
    echo "run_fuzz: fuzz_$h FAILED (exit $rc) after $runs executions; the end of its log:" >&2
    grep -E 'ERROR|BUG|SUMMARY|Test unit written|timeout|out-of-memory' "$log" | head -20 >&2 || tail -30 "$log" >&2
    for a in "$work"/crash-* "$work"/timeout-* "$work"/oom-* "$work"/leak-*; do
      [[ -e $a ]] && echo "run_fuzz: keep it: cp '$a' $here/regressions/$h/<what_it_breaks>; then fix the parser" >&2
    done
  fi
done
exit $status
