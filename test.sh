#!/usr/bin/env bash
# Quick start, step 2: the same set-up as run.sh, then the whole test suite.
#
#   ./test.sh                 main suite, then the sanitizer and fuzz stages
#   ./test.sh --quick         main suite only (local iteration)
#   ./test.sh --sanitize-all  main suite, then the WHOLE suite under ASan+UBSan
#                             (build-asan-all), then the fuzz stage
set -euo pipefail
cd "$(dirname "$0")"
quick=0
sanitize_all=0
for arg in "$@"; do
  case $arg in
    --quick) quick=1 ;;
    --sanitize-all) sanitize_all=1 ;;
    -h | --help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test.sh: unknown option '$arg' (valid: --quick, --sanitize-all)" >&2; exit 2 ;;
  esac
done
source .ci/setup.sh
g3_install_packages
g3_build build
# Which golden cases the suite reads (the rule of tests/test_support.cc,
# golden_set(); every test process prints the same line in its own log).
if [[ -n ${G3ATTN_GOLDEN_DIR:-} ]]; then
  echo "test.sh: golden cases: full set from $G3ATTN_GOLDEN_DIR (\$G3ATTN_GOLDEN_DIR)"
elif [[ -d ../shared/golden ]]; then
  echo "test.sh: golden cases: full set from $(cd ../shared/golden && pwd) (../shared/golden beside the project)"
else
  echo "test.sh: golden cases: subset (3 tiny cases) from tests/golden; set G3ATTN_GOLDEN_DIR for the full set"
fi
ctest --test-dir build --output-on-failure -j "$(nproc)"

# ---- Reliability stages (tests/fuzz/README.md) --------------------------------
if ((quick)); then
  echo "test.sh: --quick: sanitizer and fuzz stages skipped"
  exit 0
fi
stage_start=$SECONDS
# Sanitizer reports are fatal and name the line; leaks are reported too.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

if ((sanitize_all)); then
  # Everything but the LLVM JIT (libLLVM is not instrumented and slow to
  # build against), all Highway targets, every test.
  g3_build build-asan-all -DG3ATTN_SANITIZE=ON -DG3ATTN_WITH_LLVM=OFF
  ctest --test-dir build-asan-all --output-on-failure -j "$(nproc)"
else
  # The sanitizer suite of every run: every suite that parses input or owns
  # memory, selected by the CTest label `sanitize` (tests/CMakeLists.txt says
  # which suites are left out and why; --no-tests=error fails the stage if
  # the label ever selects nothing). The Highway kernels are compiled for one
  # SIMD target (AVX2; SCALAR stays as Highway 1.0.3's fallback), which keeps
  # the build lean, and the LLVM JIT is off (libLLVM is not instrumented).
  # HWY_DISABLED_TARGETS = SSSE3|SSE4|AVX3|AVX3_DL = (1<<12)|(1<<11)|(1<<8)|(1<<7).
  g3_build build-asan -DG3ATTN_SANITIZE=ON -DG3ATTN_WITH_LLVM=OFF -DCMAKE_CXX_FLAGS=-DHWY_DISABLED_TARGETS=0x1980
  G3ATTN_ISA=avx2 ctest --test-dir build-asan --output-on-failure -j "$(nproc)" -L '^sanitize$' --no-tests=error
fi
echo "test.sh: sanitizer stage took $((SECONDS - stage_start)) s"

# libFuzzer (Debian clang): build only the harnesses, replay their corpora,
# then fuzz each for 30 s. A crash fails the run and leaves the input in
# build-fuzz/fuzz-work/<harness>/ (tests/fuzz/README.md says what to do next).
stage_start=$SECONDS
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Release -DG3ATTN_FUZZ=ON -DG3ATTN_WITH_LLVM=OFF >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target fuzz_all
ctest --test-dir build-fuzz -L '^fuzz$' --output-on-failure
tests/fuzz/run_fuzz.sh build-fuzz 30
echo "test.sh: fuzz stage took $((SECONDS - stage_start)) s"
