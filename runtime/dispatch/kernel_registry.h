// Which kernel for which key: the backend policy, its fallbacks, and a
// process-wide memo so layers with equal keys share one kernel and many
// threads asking for the same key build it once.
#pragma once
#include <string>
#include <vector>

#include "generator/backend_api.h"
#include "generator/kernel_key.h"

namespace g3 {

// Backend names on the command line.
const std::vector<std::string>& backend_names();  // reference highway llvm xbyak auto
// Validates a --backend value (InputError listing the valid names).
std::string parse_backend(const std::string& name);

struct KernelChoice {
  BackendKernels kernels;        // the table every stage is called through (complete)
  std::string backend;           // backend of the attention core
  std::string stages[4];         // backend of qk, core, gemm, rmsnorm
  std::string fallback;          // why the requested backend was not used, or ""
};

// Resolves (key, backend, isa) to a complete kernel table. `backend` may be
// "auto" (rule in kernel_registry.cc, documented in `g3attn --help`);
// `isa` is a resolved ISA name (see isa.h). Missing stages come from the
// Highway backend on the same ISA (or the reference when Highway is absent).
KernelChoice kernels_for(const KernelKey& key, const std::string& backend, const std::string& isa);

// Counters for tests and `plan --json`: how many kernels this process built
// (compiled or generated) per backend since start.
int kernels_built(const std::string& backend);

}  // namespace g3
