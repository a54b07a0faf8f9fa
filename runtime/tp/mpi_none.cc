// The build without MPI (G3ATTN_WITH_MPI off): --tp is refused with the
// reason, everything else in g3attn is unchanged.
#include "generator/errors.h"
#include "runtime/tp/mpi_comm.h"

namespace g3 {

bool mpi_built() { return false; }

std::unique_ptr<Comm> mpi_world() {
  throw InputError("--tp needs MPI, and this g3attn was built without it (configure with -DG3ATTN_WITH_MPI=ON "
                   "after installing libopenmpi-dev)");
}

}  // namespace g3
