// What one rank of a tensor-parallel run holds: the degree R checked against
// the model (R must divide Nkv, so every rank gets whole KV heads with their
// query groups) and the bytes of weights and KV caches per rank, for
// `g3attn plan --tp` and the `run --tp` summary. Arithmetic only, no MPI.
#pragma once
#include <cstdint>

#include "generator/catalogue.h"
#include "generator/kernel_key.h"
#include "runtime/exec/kv_cache.h"

namespace g3 {

// InputError unless 1 <= R and R divides the model's Nkv; the message lists
// the valid R for the model.
void check_tp_degree(const ModelConfig& cfg, int ranks);

// The model one rank runs: Nkv / R KV heads and N / R query heads per layer,
// everything else unchanged (checks R first).
ModelConfig shard_config(const ModelConfig& cfg, int ranks);

struct ShardBytes {
  int ranks = 1;
  // Attention weights per rank: the q, k, v rows and o_proj columns of its
  // heads in the weight dtype, plus the four norm vectors every rank keeps
  // whole (f32).
  uint64_t weights = 0;
  KvBytes kv;  // per rank: ring (what run allocates) and the full-length layout
};

ShardBytes shard_bytes(const ModelConfig& cfg, int ranks, DType weight_dtype, int64_t context, int64_t batch,
                       DType kv_dtype, int64_t chunk);

}  // namespace g3
