#include "runtime/tp/shard_plan.h"

#include <string>

#include "generator/errors.h"

namespace g3 {

void check_tp_degree(const ModelConfig& cfg, int ranks) {
  const int K = cfg.num_kv_heads;
  if (ranks >= 1 && K % ranks == 0) return;
  std::string valid;
  for (int d = 1; d <= K; ++d)
    if (K % d == 0) valid += (valid.empty() ? "" : ", ") + std::to_string(d);
  throw InputError("--tp " + std::to_string(ranks) + " does not divide the " + std::to_string(K) +
                   " KV heads of model " + cfg.name + " (valid --tp: " + valid + ")");
}

ModelConfig shard_config(const ModelConfig& cfg, int ranks) {
  check_tp_degree(cfg, ranks);
  ModelConfig s = cfg;
  s.num_kv_heads = cfg.num_kv_heads / ranks;
  s.num_heads = cfg.num_heads / ranks;
  return s;
}

ShardBytes shard_bytes(const ModelConfig& cfg, int ranks, DType weight_dtype, int64_t context, int64_t batch,
                       DType kv_dtype, int64_t chunk) {
  const ModelConfig s = shard_config(cfg, ranks);
  const uint64_t D = uint64_t(s.hidden_size), H = uint64_t(s.head_dim);
  const uint64_t N = uint64_t(s.num_heads), K = uint64_t(s.num_kv_heads);
  const uint64_t wb = weight_dtype == DType::F32 ? 4 : 2;
  // q, k, v: (N + 2K) dh rows of D; o_proj: D rows of N dh columns.
  const uint64_t proj = ((N + 2 * K) * H * D + D * N * H) * wb;
  const uint64_t norms = (2 * H + 2 * D) * 4;
  ShardBytes b;
  b.ranks = ranks;
  b.weights = (proj + norms) * uint64_t(s.num_layers);
  b.kv = kv_bytes(s, context, batch, kv_dtype, chunk);
  return b;
}

}  // namespace g3
