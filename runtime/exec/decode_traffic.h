// The bytes one decode step of the attention stack must read from memory,
// and the time floor they set: every layer's projection weights once per
// step (shared by the batch) plus, per sequence, the K and V rows each
// layer's query can see (the whole context on global layers, the window
// on local ones; SPEC 1.4). Norm vectors, activations and the one new K/V
// row written per layer are a rounding error beside these and are left out.
// `g3attn run` reports its decode time against this floor.
#pragma once
#include <cstdint>

#include "generator/catalogue.h"
#include "generator/kernel_key.h"

namespace g3 {

struct DecodeTraffic {
  double weight_bytes = 0;  // q, k, v and o projections of every layer
  double kv_bytes = 0;      // K and V rows read, summed over the batch
  double total() const { return weight_bytes + kv_bytes; }
};

// One decode step of `batch` sequences whose queries see `context`
// positions (the step's own token included).
DecodeTraffic decode_traffic(const ModelConfig& m, DType weight_dtype, DType kv_dtype, int64_t batch, int64_t context);

}  // namespace g3
