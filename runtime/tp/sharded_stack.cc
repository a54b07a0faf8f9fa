#include "runtime/tp/sharded_stack.h"

#include <algorithm>
#include <string>

#include "generator/errors.h"
#include "runtime/exec/run_driver.h"
#include "runtime/tp/shard_plan.h"

namespace g3 {

namespace {

// The KV heads of this rank: every layer has the model's Nkv, so one split
// serves them all.
HeadRange rank_range(const ModelConfig& cfg, const Comm& comm) {
  check_tp_degree(cfg, comm.size());
  return even_head_ranges(layer_spec(cfg, 0), comm.size())[size_t(comm.rank())];
}

}  // namespace

ShardedStack::ShardedStack(const RunRequest& r, g3attn_context* context, const g3attn_model* model, int64_t chunk,
                           Comm& comm)
    : B_(r.batch),
      D_(r.config.hidden_size),
      chunk_(chunk),
      comm_(comm),
      range_(rank_range(r.config, comm)),
      layers_(r, context, model, chunk, range_) {
  layer_ms_.assign(size_t(layers_.size()), 0.0);
}

void ShardedStack::forward(const float* x, const int32_t* positions, const uint8_t* real, int64_t T, float* y) {
  if (T < 1) return;
  // All or nothing: a refused call leaves every cache as it was, and it is
  // refused on every rank before any collective call. Each g3attn_attention
  // checks only its own cache, so this rests on layer 0's call refusing
  // whatever a later layer's would refuse. Every layer's cache has taken the
  // same calls since it was made (a refused call changes none, and any other
  // failure ends the run), so the checks that read the positions and the
  // context give every layer layer 0's answer; the one check that differs
  // between layers, a ring's limit of `chunk` real tokens per call (a
  // full-length cache has none), cannot fail on a call of at most `chunk`
  // tokens. Hence the bound here rather than cutting a longer call into
  // chunks: a piece refused after earlier pieces ran would leave those
  // cached. The checks read only the arguments, which every rank shares, so
  // every rank refuses alike.
  if (T > chunk_)
    throw InputError("a sharded stack call of " + std::to_string(T) +
                     " tokens per row is longer than the chunk of " + std::to_string(chunk_) +
                     " its caches were made for");
  const int64_t R = B_ * T, n = R * D_;
  cur_.assign(x, x + n);
  part_.resize(size_t(n));
  nxt_.resize(size_t(n));
  for (int64_t l = 0; l < layers_.size(); ++l) {
    const double t = run_clock_ms();
    // The range's share of the layer's attention output, on the context's
    // pool.
    api_check(g3attn_attention(layers_.layer(l), layers_.cache(l), cur_.data(), positions, real, B_, T,
                               part_.data(), 0));
    const double tc = run_clock_ms();
    comm_.allreduce_sum(part_.data(), n);
    comm_ms_ += run_clock_ms() - tc;
    reduced_floats_ += uint64_t(n);
    // The post-norm and the residual on the sum: any range of a layer gives
    // the whole layer's result (g3attn.h), so every rank computes the same
    // hidden state.
    api_check(g3attn_finish(layers_.layer(l), cur_.data(), part_.data(), R, nxt_.data(), 0));
    cur_.swap(nxt_);
    layer_ms_[size_t(l)] += run_clock_ms() - t;
    if (on_layer) on_layer(int(l), T);
  }
  std::copy(cur_.begin(), cur_.end(), y);
}

}  // namespace g3
