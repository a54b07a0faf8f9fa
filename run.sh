#!/usr/bin/env bash
# Quick start, step 1: install what is missing, build Release in build/, run
# the main job.
set -euo pipefail
cd "$(dirname "$0")"
source .ci/setup.sh
g3_install_packages
g3_build build
build/g3attn plan --model 1b
build/g3attn run
