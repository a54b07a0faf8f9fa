// The LLVM ORC backend beyond the common entry points of backend_api.h
// (llvm_available, llvm_kernels): counters the CLI and tests observe, a
// compile path with an explicit on-disk cache, and the generated assembly.
//
// How a kernel is made (llvm_jit.cc): IR for the key (llvm_ir.cc) -> a short
// function pass pipeline for the target (LLVM's O1-O3 under G3ATTN_LLVM_OPT)
// -> an object file -> the on-disk cache (generator/llvm/jit_cache.h) ->
// linked into the process-wide LLJIT, one JITDylib per object. A later
// process with the same key, CPU, features, ISA cap, LLVM version and
// generator version loads the object and links it without compiling.
#pragma once
#include <string>

#include "generator/backend_api.h"
#include "generator/kernel_key.h"

namespace g3 {

class JitCache;

// Objects this process compiled, and objects it loaded from the disk cache
// instead (both count kernel keys, one object per key and ISA).
int llvm_compiles();
int llvm_cache_hits();

// What the code for an ISA cap is compiled for: "best" and "host" mean this
// CPU with all its features, as does avx3_dl on a CPU that has it (it is the
// top Highway level; newer features such as AVX512_BF16 come with it);
// lower caps name a generic CPU of that level (x86-64-v4, x86-64-v3,
// x86-64-v2, core2, x86-64).
struct LlvmTarget {
  std::string cpu;
  std::string features;  // "+avx2,+fma,..." or "" (implied by cpu)
  int vector_bits = 128;
};
LlvmTarget llvm_target_for(const std::string& isa);

// llvm_kernels with an explicit cache (null: no disk cache) instead of the
// process's default one. Every call compiles or loads a fresh object.
BackendKernels llvm_kernels_with(const KernelKey& key, const std::string& isa, JitCache* cache);

// The optimised assembly of a key's kernels (for reading what the JIT
// emits, e.g. to check that the hot loops use zmm FMAs).
std::string llvm_kernel_asm(const KernelKey& key, const std::string& isa);

}  // namespace g3
