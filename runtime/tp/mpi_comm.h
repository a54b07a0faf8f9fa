// The MPI world as a Comm (comm.h). mpi_comm.cc implements it on Open MPI;
// mpi_none.cc is compiled instead in a build without MPI (G3ATTN_WITH_MPI
// off), where asking for the world is refused with the reason.
#pragma once
#include <memory>

#include "runtime/tp/comm.h"

namespace g3 {

// Whether this g3attn was built with MPI.
bool mpi_built();

// Initialises MPI (once per process) and returns MPI_COMM_WORLD; MPI is
// finalised when the returned object is destroyed. In a build without MPI
// this throws InputError saying so.
std::unique_ptr<Comm> mpi_world();

}  // namespace g3
