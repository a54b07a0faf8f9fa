// Which kernel for which key: the backend policy over the backend table
// (backends.h), its fallbacks, and the process-wide memo of built kernels,
// so layers with equal keys share one kernel and many threads asking for
// the same key build it once.
#pragma once
#include <string>
#include <vector>

#include "generator/backend_api.h"
#include "generator/kernel_key.h"
#include "runtime/dispatch/backends.h"
#include "runtime/dispatch/profile.h"

namespace g3 {

// Backend names on the command line: the table's, then "auto".
const std::vector<std::string>& backend_names();  // reference highway llvm xbyak amx auto
// Validates a --backend value (InputError listing the valid names).
std::string parse_backend(const std::string& name);

struct KernelChoice {
  BackendKernels kernels;        // the table every stage is called through (complete)
  std::string backend;           // backend of the attention core
  StageBackends stages;          // backend of each stage
  std::string fallback;          // why the requested backend was not used, or ""
  std::string source;            // auto: where its choice came from (profile.h AutoRoute); else ""
};

// Resolves (key, backend, isa) to a complete kernel table. `backend` may be
// "auto": the backend this CPU's tune profile measured fastest for the key,
// phase and ISA, else the static rule (auto_route in profile.h);
// `isa` is a resolved ISA name (see isa.h). A backend that cannot serve the
// request here is replaced by its fallback, and the stages it leaves null
// come from its fallback's complete table (for the JITs, Highway on the
// same ISA).
KernelChoice kernels_for(const KernelKey& key, const std::string& backend, const std::string& isa,
                         Phase phase = Phase::Prefill);
// The kernels of a route auto chose (a profile's winner at some context,
// context_routes in profile.h): kernels_for of its backend, with its source.
KernelChoice kernels_for(const KernelKey& key, const AutoRoute& route, const std::string& isa);

// Counters for tests and `plan --json`: how many kernels this process built
// (compiled or generated) per backend since start.
int kernels_built(const std::string& backend);

}  // namespace g3
