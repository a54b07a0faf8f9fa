// The attention stack of a whole model: every layer's block routed to its
// kernel under the 5:1 local/global pattern (layers with equal kernel keys
// share one kernel), KV caches (kv_cache.h), chunked prefill and decode over a
// batch with per-row positions and padding, all on one thread pool. The MLPs,
// embeddings and logits are not part of it: the hidden state flows from block
// to block, y = x + RMSNorm(Attention(RMSNorm(x))) (SPEC 1.2 steps 1-4).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "generator/catalogue.h"
#include "runtime/exec/block.h"
#include "runtime/exec/kv_cache.h"
#include "runtime/exec/thread_pool.h"
#include "runtime/io/layer_weights.h"

namespace g3 {

struct ModelOptions {
  std::string backend = "auto";
  std::string isa = "best";     // an ISA name of isa.h; "best" is resolved here
  DType kv_dtype = DType::F32;
  DType compute = DType::F32;   // the compute mode (kernel_key.h)
  ProjectionRoute proj = ProjectionRoute::Auto;  // the projection provider (onednn_route.h)
  int64_t batch = 1;
  int64_t context = 4096;       // positions per row the caches hold
  int64_t chunk = 512;          // most tokens per row in one block call
  int threads = 0;              // 0: every core
};

class Model {
 public:
  Model(const ModelConfig& cfg, const WeightSource& weights, const ModelOptions& o);

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opt_; }
  const std::vector<PreparedLayer>& layers() const { return layers_; }
  ThreadPool& pool() { return *pool_; }
  const LayerKvCache& cache(int layer) const { return caches_[size_t(layer)]; }
  // K/V bytes the caches hold (ring: local layers W + chunk - 1 slots).
  uint64_t kv_bytes_allocated() const;

  void reset();  // empties every cache; timings are kept

  // T new tokens per row through every layer: x and y [B][T][D] (may alias),
  // positions [B][T], real [B][T] (null: all real; 0 = padding). Calls with
  // more than `chunk` tokens run as consecutive chunks. A call the caches
  // refuse (LayerKvCache::check_append: positions, context, ring size) throws
  // InputError before any layer runs, so every cache is left as it was and
  // the model may go on with good input.
  void forward(const float* x, const int32_t* positions, const uint8_t* real, int64_t T, float* y);

  // Milliseconds spent in each layer since construction (or clear_timings).
  const std::vector<double>& layer_ms() const { return layer_ms_; }
  void clear_timings();
  // Called after each layer of each chunk: (layer index, tokens per row of the chunk).
  std::function<void(int, int64_t)> on_layer;

 private:
  ModelConfig cfg_;
  ModelOptions opt_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<PreparedLayer> layers_;
  std::vector<LayerKvCache> caches_;
  std::vector<double> layer_ms_;
  BlockScratch scratch_;
  std::vector<float> cur_, nxt_;
  std::vector<int32_t> pos_;
  std::vector<uint8_t> real_;
};

}  // namespace g3
