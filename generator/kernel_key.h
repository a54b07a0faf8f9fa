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

  // Stable, readable, and a valid C identifier fragment, e.g.
  // "dh256_g4_w512_b10000_s1_a0x1p-4_kvf32_wbf16" (alpha in hex float so
  // it round-trips exactly).
  std::string str() const;
  // The same, for C identifiers (only [A-Za-z0-9_]).
  std::string ident() const;
  bool operator==(const KernelKey&) const = default;
};

KernelKey kernel_key(const LayerSpec& l, DType kv, DType weights);
// Distinct keys of a model, in first-use order (local before global for Gemma 3).
std::vector<KernelKey> distinct_keys(const ModelConfig& m, DType kv, DType weights);

}  // namespace g3
