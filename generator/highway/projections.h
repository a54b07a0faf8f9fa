// The Highway backend's projection kernels (GEMM/GEMV over panel-packed
// weights, SPEC 1.3 steps A and J) and row RMSNorm (SPEC 2.1), one instance
// per compiled Highway target. Kernels live in projections-inl.h; the
// per-target tables in projections.cc.
#pragma once
#include <string>

#include "templates/kernel_contract.h"

namespace g3 {

// The kernels for one Highway target, named as in isa_names()
// (generator/isa.h).
// Throws g3::InputError when that target is not compiled into this build or
// this CPU cannot run it. The functions are single-threaded; callers split
// the work by column panels (gemm) or rows (rmsnorm).
g3_gemm_fn highway_gemm(const std::string& isa);
g3_rmsnorm_fn highway_rmsnorm(const std::string& isa);

}  // namespace g3
