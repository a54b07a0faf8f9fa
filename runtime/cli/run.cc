// Placeholder until the run subcommand lands.
#include "commands.h"
#include "errors.h"

namespace g3::cli {

int cmd_run(int, char**, int) { throw InputError("'run' is not available in this build yet"); }

}  // namespace g3::cli
