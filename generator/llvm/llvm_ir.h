// LLVM IR for one kernel key: the g3_qk_fn and g3_core_fn stages of the
// kernel contract (templates/kernel_contract.h) with every constant of the
// key folded in (head_dim, G, W, RoPE base and scale, alpha, KV dtype).
// Pure: key and target in, IR out; compiling and linking live in llvm_jit.cc.
#pragma once
#include <cstdint>
#include <string>

#include "kernel_key.h"

namespace llvm {
class Module;
}

namespace g3::llvmjit {

// Bump whenever the emitted IR changes: it is part of every on-disk cache
// entry's identity, so old objects are never reused by a newer generator.
constexpr int kGeneratorVersion = 4;

// Names of the emitted functions (each object lives in its own JITDylib, so
// the names are the same for every key).
constexpr const char* kQkName = "g3_llvm_qk";
constexpr const char* kCoreName = "g3_llvm_core";
// Helpers the JIT'd code calls, defined in llvm_jit.cc and registered as
// absolute symbols: the per-token RoPE cos/sin table (double precision, as
// SPEC 2.2 and the reference do it), the natural log for lse, and the
// structured mask's bounds of a query row.
constexpr const char* kRopeHelper = "g3_llvm_rope_table";
constexpr const char* kLogHelper = "g3_llvm_log";
// The structured mask's row bounds (templates/mask_rule.h): g3_bounds_of.
constexpr const char* kBoundsHelper = "g3_llvm_row_bounds";

struct IrTarget {
  std::string cpu;       // "target-cpu" attribute
  std::string features;  // "target-features" attribute
  int vector_bits = 128; // widest vector register the code may use (128, 256, 512)
};

// Tile sizes the core uses, exposed for the report and tests.
struct CoreTiling {
  int vl;        // floats per vector (a power of two dividing head_dim)
  int tq;        // query tokens per tile on the main path (the tail goes 1 by 1)
  int tk;        // key slots per tile (the unit of mask-based skipping)
};
CoreTiling core_tiling(const KernelKey& key, const IrTarget& t);

// Adds kQkName and kCoreName (external, C calling convention) to `m`.
void emit_kernels(llvm::Module& m, const KernelKey& key, const IrTarget& t);

}  // namespace g3::llvmjit
