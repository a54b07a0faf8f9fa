// One rank's part of a tensor-parallel attention stack: in every layer the
// rank's KV head range (head_range.h) with its query groups, its slice of
// the projection weights and only those heads' KV caches. Each layer runs
// the range's block up to its partial output projection, the ranks sum the
// partials (Comm::allreduce_sum), and every rank then applies the post-norm
// and the residual to the sum (SPEC 1.2 steps 3-4), so every rank carries
// the same hidden state into the next layer. Model (exec/model.h) is the
// single-process stack this mirrors, chunking and cache checks included.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "generator/catalogue.h"
#include "runtime/exec/block.h"
#include "runtime/exec/head_range.h"
#include "runtime/exec/kv_cache.h"
#include "runtime/exec/model.h"
#include "runtime/exec/run_driver.h"
#include "runtime/exec/thread_pool.h"
#include "runtime/tp/comm.h"

namespace g3 {

// The weights of KV heads `r` of the layer `full` (the whole layer's spec).
using RangeWeightSource = std::function<LayerWeights(const LayerSpec& full, HeadRange r)>;

class ShardedStack {
 public:
  // Rank comm.rank() of comm.size() ranks; the size must divide Nkv.
  ShardedStack(const ModelConfig& cfg, const RangeWeightSource& weights, const ModelOptions& o, Comm& comm);

  const std::vector<PreparedLayer>& layers() const { return layers_; }
  // What run_driver.h asks of a stack.
  int64_t num_layers() const { return int64_t(layers_.size()); }
  RunLayer route(int64_t l) const { return run_layer_route(layers_[size_t(l)]); }
  HeadRange range() const { return range_; }
  ThreadPool& pool() { return *pool_; }
  uint64_t kv_bytes_allocated() const;

  // As Model::forward: x and y [B][T][D], positions [B][T], real [B][T] or
  // null. Every rank must call it with the same arguments (the all-reduce
  // is collective); a call the caches refuse throws on every rank alike,
  // before any layer runs.
  void forward(const float* x, const int32_t* positions, const uint8_t* real, int64_t T, float* y);

  // Milliseconds per layer (all-reduce included) and, of those, in the
  // all-reduce; floats summed per rank so far.
  const std::vector<double>& layer_ms() const { return layer_ms_; }
  double comm_ms() const { return comm_ms_; }
  uint64_t reduced_floats() const { return reduced_floats_; }
  std::function<void(int, int64_t)> on_layer;

 private:
  ModelConfig cfg_;
  ModelOptions opt_;
  Comm& comm_;
  HeadRange range_;
  std::unique_ptr<ThreadPool> pool_;
  std::vector<PreparedLayer> layers_;
  std::vector<LayerKvCache> caches_;
  std::vector<double> layer_ms_;
  double comm_ms_ = 0;
  uint64_t reduced_floats_ = 0;
  BlockScratch scratch_;
  std::vector<float> cur_, nxt_;
  std::vector<int32_t> pos_;
  std::vector<uint8_t> real_;
};

}  // namespace g3
