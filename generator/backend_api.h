// What every kernel backend hands the runtime for one kernel key: a table of
// contract functions plus how it was made. The runtime's backend table
// (runtime/dispatch/backends.h) calls these entry points and its kernel
// registry (runtime/dispatch/kernel_registry.h) picks and memoises the
// results; backends never see layers, caches or weights.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "generator/isa.h"
#include "generator/kernel_key.h"
#include "templates/kernel_contract.h"

namespace g3 {

struct BackendKernels {
  g3_kernel_table table{};      // null entries: stage not provided by this backend
  std::string isa;              // the ISA the code targets ("avx2", "avx3", "scalar", ...)
  bool specialised = true;      // false: a generic kernel with runtime parameters
  double compile_ms = 0;        // JIT: time from request to ready
  bool cached = false;          // JIT: loaded from the on-disk cache
  std::string note;             // e.g. why a fallback happened
  std::shared_ptr<void> owner;  // keeps JIT code alive while the table is used
};

// Entry points of the backend libraries. Highway and Xbyak are always built;
// the LLVM functions exist only when g3_llvm is (-DG3ATTN_WITH_LLVM), which
// only the runtime's backend table needs to know. `isa` is a resolved name
// from isa_names() (generator/isa.h): for the JITs it is a cap, not a
// demand. They throw InputError when they cannot serve the request, with a
// message that says why. Every call builds afresh: the runtime's kernel
// registry is the one memo of built kernels.
BackendKernels highway_kernels(const KernelKey& key, const std::string& isa);
std::vector<std::string> highway_compiled_isas();

bool llvm_available(std::string* why);
BackendKernels llvm_kernels(const KernelKey& key, const std::string& isa);

bool xbyak_available(const KernelKey& key, const std::string& isa, std::string* why);
BackendKernels xbyak_kernels(const KernelKey& key, const std::string& isa);

}  // namespace g3
