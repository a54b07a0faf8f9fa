// The specialisation key (DESIGN.md "The specialisation key"): everything an
// attention kernel may bake in as a constant. Two layers with equal keys share
// one compiled kernel, so a Gemma 3 model needs two keys per dtype.
#pragma once
#include <string>
#include <vector>

#include "generator/catalogue.h"

namespace g3 {

enum class DType { F32, BF16 };
const char* to_string(DType d);                 // "f32" | "bf16"
DType parse_dtype(const std::string& s, const std::string& flag);  // throws InputError

struct KernelKey {
  int head_dim = 0;
  int group = 0;           // G = N / Nkv
  int window = 0;          // W on local layers, 0 on global layers
  double rope_base = 0;
  double rope_scale = 1;
  float alpha = 0;
  DType kv_dtype = DType::F32;
  DType weight_dtype = DType::BF16;
  // The compute mode (README "Compute modes"): F32, or BF16, where the inputs
  // of every dot product (normed activations, attention output, q, K, the
  // softmax weights, V) are rounded to bf16 and products accumulate in f32;
  // norms, RoPE, softmax and residuals stay f32.
  DType compute = DType::F32;

  // Stable and readable, e.g. "dh256_g4_local512_b10000_s1_a0.0625_kvf32_wbf16"
  // ("global" instead of "local<W>" on global layers; "_cbf16" before the
  // weight dtype in the bf16 compute mode, so f32-mode keys read as they
  // always did). The numbers are
  // printed with "%.9g": nine significant digits give back every float
  // exactly, so alpha round-trips, but rope base and scale are doubles, so
  // two of them that differ only past the ninth digit print alike. The
  // string is not an identifier ('.', '-' and '+' occur); ident() is.
  // Its format is part of the on-disk LLVM cache identity and of the key
  // strings in generated registries (and the generated smoke test parses
  // them), so changing it orphans cached objects and generated trees.
  std::string str() const;
  // key_ident(str()): the key as a C identifier fragment.
  std::string ident() const;
  bool operator==(const KernelKey&) const = default;
};

// A key string as a C identifier fragment (only [A-Za-z0-9_]), for names
// of generated namespaces, files and JIT modules: '.' becomes 'p', '-'
// becomes 'm', '+' is dropped and any other character becomes 'x'.
std::string key_ident(const std::string& key);

KernelKey kernel_key(const LayerSpec& l, DType kv, DType weights, DType compute = DType::F32);
// Distinct keys of a model, in first-use order (local before global for Gemma 3).
std::vector<KernelKey> distinct_keys(const ModelConfig& m, DType kv, DType weights, DType compute = DType::F32);

}  // namespace g3
