// One layer's attention block on the fast kernels: weights packed once,
// kernels resolved once (one dispatch at the top, same-target calls below),
// then called through the kernel contract.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "catalogue.h"
#include "kernel_key.h"
#include "kernel_registry.h"
#include "layer_weights.h"
#include "packed_weights.h"

namespace g3 {

struct PreparedLayer {
  LayerSpec spec;
  KernelKey key;
  KernelChoice kernels;
  // q, k and v projections fused into one [N*dh + 2*Nkv*dh, D] matrix so the
  // normed input is streamed once; then the output projection.
  PackedWeights wqkv, wo;
  std::vector<float> q_norm, k_norm, input_norm, post_norm;
};

PreparedLayer prepare_layer(const LayerSpec& spec, const LayerWeights& w, DType kv_dtype, const std::string& backend,
                            const std::string& isa);

// One block call without a cache, as `g3attn apply` and the golden cases
// run it: B rows of T tokens; keys are this call's tokens; key_real[b*T+s]
// marks real tokens (null: all real). Rows with no visible key are
// don't-care (zeros in attn_out). attn_out may be null.
void run_block_nocache(const PreparedLayer& L, const float* x, const int32_t* positions, const int32_t* key_real,
                       int64_t B, int64_t T, float* block_out, float* attn_out);

}  // namespace g3
