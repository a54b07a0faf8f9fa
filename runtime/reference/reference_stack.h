// The official attention stack in double precision, for `g3attn run
// --verify` and the runtime tests: every layer's block as ref::block computes
// it, with the official full-length cache of SPEC 1.5.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "generator/catalogue.h"
#include "generator/kernel_key.h"
#include "runtime/exec/thread_pool.h"
#include "runtime/io/layer_weights.h"
#include "runtime/reference/reference.h"

namespace g3 {

// The official layout in double precision (SPEC 1.3-1.6), for verification:
// every layer has a full-length ref::Cache of `cache_len` slots; a call's T
// tokens (padding included) are written at slots end_index .. end_index+T-1
// and the caller mask is the official one, mask[b][t][s] = slot s holds a real
// token AND s <= end_index + t, with the sliding mask on local layers and
// K_MASK replacement, softmax over all slots. The same arithmetic as
// ref::attention / ref::block (weights widened to f32 once, not per call),
// split over rows and heads on the pool. kv_dtype as in ref::attention: bf16
// rounds each K and V element once as it enters the cache.
class ReferenceStack {
 public:
  ReferenceStack(const ModelConfig& cfg, const WeightSource& weights, int64_t batch, int64_t cache_len,
                 ThreadPool& pool, DType kv_dtype = DType::F32, DType compute = DType::F32);
  void forward(const float* x, const int32_t* positions, const uint8_t* real, int64_t T, float* y);
  std::function<void(int)> on_layer;

 private:
  struct Layer {
    LayerSpec spec;
    std::vector<float> wq, wk, wv, wo, q_norm, k_norm, input_norm, post_norm;
    ref::Cache cache;
  };
  void block(Layer& L, const float* x, const int32_t* pos, int64_t T, int64_t start, float* y);
  ModelConfig cfg_;
  int64_t B_, S_;
  ThreadPool& pool_;
  DType kv_dtype_;
  int32_t compute_;  // G3_COMPUTE_F32 or G3_COMPUTE_BF16
  std::vector<Layer> layers_;
  std::vector<uint8_t> slot_real_;  // [B][S]
  int64_t end_index_ = 0;
};

}  // namespace g3
