// Placeholder until the bench subcommand lands.
#include "commands.h"
#include "errors.h"

namespace g3::cli {

int cmd_bench(int, char**, int) { throw InputError("'bench' is not available in this build yet"); }

}  // namespace g3::cli
