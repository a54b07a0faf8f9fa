#include "runtime/tp/sharded_stack.h"

#include <algorithm>
#include <chrono>

#include "generator/errors.h"
#include "runtime/dispatch/isa.h"
#include "runtime/tp/shard_plan.h"

namespace g3 {

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

ShardedStack::ShardedStack(const ModelConfig& cfg, const RangeWeightSource& weights, const ModelOptions& o,
                           Comm& comm)
    : cfg_(cfg), opt_(o), comm_(comm) {
  check_tp_degree(cfg, comm.size());
  if (o.batch < 1) throw InputError("--batch must be at least 1");
  if (o.context < 1) throw InputError("the context must be at least 1 position");
  if (o.chunk < 1) throw InputError("--chunk must be at least 1");
  opt_.chunk = std::min(o.chunk, o.context);
  opt_.isa = resolve_isa(o.isa);
  pool_ = std::make_unique<ThreadPool>(o.threads);
  const std::vector<LayerSpec> specs = layer_specs(cfg);
  // Every layer has the model's Nkv, so one split serves them all.
  range_ = even_head_ranges(specs.front(), comm.size())[size_t(comm.rank())];
  layers_.resize(specs.size());
  pool_->parallel_for(int64_t(specs.size()), [&](int64_t i) {
    const LayerSpec& full = specs[size_t(i)];
    layers_[size_t(i)] = prepare_layer(head_range_spec(full, range_), weights(full, range_), opt_.kv_dtype,
                                       opt_.backend, opt_.isa, opt_.compute, opt_.proj);
  });
  for (const LayerSpec& s : specs)
    caches_.emplace_back(head_range_spec(s, range_), opt_.kv_dtype, opt_.batch, opt_.context, opt_.chunk);
  layer_ms_.assign(specs.size(), 0.0);
}

uint64_t ShardedStack::kv_bytes_allocated() const {
  uint64_t n = 0;
  for (const auto& c : caches_) n += c.bytes();
  return n;
}

void ShardedStack::forward(const float* x, const int32_t* positions, const uint8_t* real, int64_t T, float* y) {
  const int64_t B = opt_.batch, D = cfg_.hidden_size;
  // All or nothing, as Model::forward: every cache checks the whole call
  // first. The checks depend only on the arguments, which every rank shares,
  // so a refusal happens on every rank before any collective call.
  for (const LayerKvCache& c : caches_)
    for (int64_t b = 0; b < B; ++b)
      c.check_append(b, positions + b * T, real ? real + b * T : nullptr, T, opt_.chunk);
  const BlockSplit split;
  for (int64_t t0 = 0; t0 < T; t0 += opt_.chunk) {
    const int64_t Tc = std::min(opt_.chunk, T - t0), R = B * Tc;
    cur_.resize(size_t(R * D));
    nxt_.resize(size_t(R * D));
    pos_.resize(size_t(R));
    real_.resize(size_t(R));
    for (int64_t b = 0; b < B; ++b) {
      std::copy_n(x + (b * T + t0) * D, Tc * D, cur_.data() + b * Tc * D);
      std::copy_n(positions + b * T + t0, Tc, pos_.data() + b * Tc);
      if (real) std::copy_n(real + b * T + t0, Tc, real_.data() + b * Tc);
    }
    for (size_t l = 0; l < layers_.size(); ++l) {
      const PreparedLayer& L = layers_[l];
      const double t = now_ms();
      // The range's block up to its output projection: its share of the
      // layer's attention output lands in scratch_.a [R][D].
      run_block_cached(L, caches_[l], cur_.data(), pos_.data(), real ? real_.data() : nullptr, B, Tc, nullptr,
                       *pool_, scratch_, split);
      const double tc = now_ms();
      comm_.allreduce_sum(scratch_.a.data(), R * D);
      comm_ms_ += now_ms() - tc;
      reduced_floats_ += uint64_t(R * D);
      // Post-norm and residual on the sum, with the block's own norm kernel
      // and token blocks, as run_block_cached applies them unsharded.
      const g3_kernel_table& k = L.for_tokens(Tc, split.decode_max_tokens).kernels.table;
      const int64_t tb = split.token_block, ntb = (R + tb - 1) / tb;
      const float eps = L.spec.rms_eps;
      pool_->parallel_for(ntb, [&](int64_t i) {
        const int64_t r0 = i * tb, r1 = std::min(R, r0 + tb);
        k.rmsnorm(scratch_.a.data() + r0 * D, r1 - r0, D, D, L.post_norm.data(), eps, cur_.data() + r0 * D,
                  nxt_.data() + r0 * D, D);
      });
      cur_.swap(nxt_);
      layer_ms_[l] += now_ms() - t;
      if (on_layer) on_layer(int(l), Tc);
    }
    for (int64_t b = 0; b < B; ++b) std::copy_n(cur_.data() + b * Tc * D, Tc * D, y + (b * T + t0) * D);
  }
}

}  // namespace g3
