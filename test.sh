#!/usr/bin/env bash
# Quick start, step 2: the same set-up as run.sh, then the whole test suite.
set -euo pipefail
cd "$(dirname "$0")"
source .ci/setup.sh
g3_install_packages
g3_build build
ctest --test-dir build --output-on-failure -j "$(nproc)"
