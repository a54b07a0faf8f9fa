// LLVM IR for one kernel key: the g3_qk_fn and g3_core_fn stages of the
// kernel contract (templates/kernel_contract.h) with every constant of the
// key folded in (head_dim, G, W, RoPE base and scale, alpha, KV dtype).
// Pure: key and target in, IR out; compiling and linking live in llvm_jit.cc.
#pragma once
#include <cstdint>
#include <string>

#include "generator/kernel_key.h"

namespace llvm {
class Module;
}

namespace g3::llvmjit {

// Bump whenever the emitted IR changes: it is part of every on-disk cache
// entry's identity, so old objects are never reused by a newer generator.
constexpr int kGeneratorVersion = 10;

// Names of the emitted functions (each object lives in its own JITDylib, so
// the names are the same for every key).
constexpr const char* kQkName = "g3_llvm_qk";
constexpr const char* kCoreName = "g3_llvm_core";
// Helpers the JIT'd code calls, defined in llvm_jit.cc and registered as
// absolute symbols in each kernel's JITDylib: the per-token RoPE cos/sin
// table (double precision, as SPEC 2.2 and the reference do it); the
// structured mask of templates/mask_rule.h (bounds of a tile's rows, a key
// tile's class and slot metadata); and the online softmax of
// templates/softmax-inl.h compiled for the kernel's ISA (generator/highway/
// flash_ops.h), so the rule of which keys count and how is the one every
// backend uses.
constexpr const char* kRopeHelper = "g3_llvm_rope_table";
constexpr const char* kTileRowsHelper = "g3_llvm_tile_rows";
constexpr const char* kTileClassHelper = "g3_llvm_tile_class";
constexpr const char* kInitRowsHelper = "g3_llvm_init_rows";
constexpr const char* kSoftmaxHelper = "g3_llvm_softmax_tile";
constexpr const char* kFinishRowHelper = "g3_llvm_finish_row";

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
  int qk_rows;   // register block of S = Q K^T: at most qk_rows rows x qk_keys keys
  int qk_keys;
  int pv_rows;   // register block of O += P V: at most pv_rows rows x pv_vecs vectors
  int pv_vecs;
};
CoreTiling core_tiling(const KernelKey& key, const IrTarget& t);

// Adds kQkName and kCoreName (external, C calling convention) to `m`.
void emit_kernels(llvm::Module& m, const KernelKey& key, const IrTarget& t);

}  // namespace g3::llvmjit
