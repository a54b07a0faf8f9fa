// The g3attn subcommands; each lives in its own file of runtime/cli/.
#pragma once

namespace g3::cli {

// Each returns the process exit code; argv[first] is the first argument
// after the subcommand name. They throw InputError for bad input.
int cmd_plan(int argc, char** argv, int first);
int cmd_apply(int argc, char** argv, int first);
int cmd_run(int argc, char** argv, int first);
int cmd_bench(int argc, char** argv, int first);
int cmd_generate(int argc, char** argv, int first);
int cmd_tune(int argc, char** argv, int first);

}  // namespace g3::cli
