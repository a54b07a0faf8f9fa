// `g3attn run --tp R`: the run command's tensor-parallel path (runtime/tp/),
// entered from cmd_run once the usual run flags are parsed.
#pragma once
#include "runtime/cli/args.h"
#include "runtime/exec/run.h"

namespace g3::cli {

// argv[first..] are the run command's arguments: every rank must have been
// started with the same ones. Returns the exit code.
int run_tp(const Args& a, RunRequest r, int argc, char** argv, int first);

}  // namespace g3::cli
