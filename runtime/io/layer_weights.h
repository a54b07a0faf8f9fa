// One layer's attention-block weights, in HF layout ([out, in] matrices,
// zero-centred norm vectors), loaded from safetensors by HF names or drawn at
// random with checkpoint-like magnitudes. bf16 matrices stay bf16.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "generator/catalogue.h"
#include "generator/kernel_key.h"
#include "runtime/io/safetensors.h"

namespace g3 {

struct WeightMatrix {
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;  // HF [out, in]
  std::vector<float> f32;      // when dtype == F32
  std::vector<uint16_t> bf16;  // when dtype == BF16
  float at(int64_t r, int64_t c) const;
  std::vector<float> to_f32() const;
};

struct LayerWeights {
  WeightMatrix q_proj;  // [N*dh, D]
  WeightMatrix k_proj;  // [Nkv*dh, D]
  WeightMatrix v_proj;  // [Nkv*dh, D]
  WeightMatrix o_proj;  // [D, N*dh]
  std::vector<float> q_norm, k_norm;          // [dh]
  std::vector<float> input_norm, post_norm;   // [D]
};

// Finds a tensor by full name, or returns nullptr. `describe` names the
// checkpoint in messages (a file or a directory).
struct TensorSource {
  std::function<const TensorView*(const std::string&)> find;
  std::string describe;
};
TensorSource tensor_source(const SafeTensorsFile& f);

// The HF prefix under which layer `index` is stored (SPEC 3.4); throws
// InputError when the layer is under none of them.
std::string find_layer_prefix(const TensorSource& src, int index);

// Loads and checks every tensor's shape against the spec; F16 tensors are
// widened to f32. Throws InputError naming the tensor and the mismatch.
LayerWeights load_layer_weights(const TensorSource& src, const LayerSpec& spec);
// The tensor `name` of `src` with exactly `shape`; InputError otherwise,
// naming the tensor and what the config needs it to be (`meaning`). Every
// reader of a layer's tensors (whole or a head range's rows) asks this way,
// so a bad checkpoint reads the same whichever reads it.
const TensorView& need_tensor(const TensorSource& src, const std::string& name, const std::vector<int64_t>& shape,
                              const std::string& meaning);

// Random weights from a fixed seed: projections N(0, 0.02^2), norm weights
// N(0, 0.1^2), as in a real checkpoint. Deterministic for (spec, seed, dtype).
LayerWeights random_layer_weights(const LayerSpec& spec, uint64_t seed, DType dtype);

// A layer's weights on demand (random from a seed, or read from a checkpoint).
using WeightSource = std::function<LayerWeights(const LayerSpec&)>;

}  // namespace g3
