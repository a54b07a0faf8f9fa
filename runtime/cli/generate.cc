// Placeholder until the generate subcommand lands.
#include "commands.h"
#include "errors.h"

namespace g3::cli {

int cmd_generate(int, char**, int) { throw InputError("'generate' is not available in this build yet"); }

}  // namespace g3::cli
