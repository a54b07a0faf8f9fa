// One rank's part of a tensor-parallel attention stack, run through the C
// API (include/g3attn/g3attn.h) as an engine that splits layers across
// ranks would call it: in every layer the rank's KV-head range as a layer of
// its own (g3attn_layer_create_heads: the range's query groups, its rows of
// the q/k/v projections and columns of o_proj) with a cache of only those
// heads (run_layers.h makes both). Each layer runs the range's attention
// (g3attn_attention: its share of the attention output, before the
// post-norm), the ranks sum the shares (Comm::allreduce_sum), and every
// rank then applies the post-norm and the residual to the sum
// (g3attn_finish, SPEC 1.2 steps 3-4), so every rank carries the same hidden
// state into the next layer. It mirrors the single-process stack of
// cli/api_run.cc, whose layers are whole and run one g3attn_block each.
#pragma once
#include <g3attn/g3attn.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/api/run_layers.h"
#include "runtime/exec/head_range.h"
#include "runtime/exec/run.h"
#include "runtime/tp/comm.h"

namespace g3 {

class ShardedStack {
 public:
  // Rank comm.rank() of comm.size() ranks (the size must divide Nkv): its
  // range of every layer of `model`, made in `context` with r's weights,
  // and caches for calls of at most `chunk` tokens per row.
  ShardedStack(const RunRequest& r, g3attn_context* context, const g3attn_model* model, int64_t chunk,
               Comm& comm);

  // What run_driver.h asks of a stack.
  int64_t num_layers() const { return layers_.size(); }
  RunLayer route(int64_t l) const { return layers_.route(l); }
  HeadRange range() const { return range_; }
  uint64_t kv_bytes_allocated() const { return layers_.kv_bytes(); }

  // x and y [B][T][D], positions [B][T], real [B][T] or null, with T at
  // most the chunk (run_driver.h cuts the prompt into chunks; forward says
  // why it does not). Every rank must call it with the same arguments (the
  // all-reduce is collective); a call the caches refuse throws on every rank
  // alike, before any layer runs.
  void forward(const float* x, const int32_t* positions, const uint8_t* real, int64_t T, float* y);

  // Milliseconds per layer (all-reduce included) and, of those, in the
  // all-reduce; floats summed per rank so far.
  const std::vector<double>& layer_ms() const { return layer_ms_; }
  double comm_ms() const { return comm_ms_; }
  uint64_t reduced_floats() const { return reduced_floats_; }
  std::function<void(int, int64_t)> on_layer;

 private:
  int64_t B_, D_, chunk_;
  Comm& comm_;
  HeadRange range_;
  RunLayers layers_;
  std::vector<double> layer_ms_;
  double comm_ms_ = 0;
  uint64_t reduced_floats_ = 0;
  std::vector<float> cur_, part_, nxt_;
};

}  // namespace g3
