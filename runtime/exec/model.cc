#include "runtime/exec/model.h"

#include <algorithm>
#include <chrono>

#include "generator/errors.h"
#include "runtime/dispatch/isa.h"

namespace g3 {

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Model::Model(const ModelConfig& cfg, const WeightSource& weights, const ModelOptions& o) : cfg_(cfg), opt_(o) {
  if (o.batch < 1) throw InputError("--batch must be at least 1");
  if (o.context < 1) throw InputError("the context must be at least 1 position");
  if (o.chunk < 1) throw InputError("--chunk must be at least 1");
  opt_.chunk = std::min(o.chunk, o.context);
  opt_.isa = resolve_isa(o.isa);  // "best" becomes this machine's best; others are checked
  pool_ = std::make_unique<ThreadPool>(o.threads);
  const std::vector<LayerSpec> specs = layer_specs(cfg);
  // Layers are independent until they run, so drawing or reading and packing
  // their weights is spread over the pool; kernels_for memoises by key, so
  // layers with equal keys get the one kernel.
  layers_.resize(specs.size());
  pool_->parallel_for(int64_t(specs.size()), [&](int64_t i) {
    LayerWeights w = weights(specs[size_t(i)]);
    layers_[size_t(i)] = prepare_layer(specs[size_t(i)], w, opt_.kv_dtype, opt_.backend, opt_.isa, opt_.compute,
                                     opt_.proj);
  });
  for (const LayerSpec& s : specs) caches_.emplace_back(s, opt_.kv_dtype, opt_.batch, opt_.context, opt_.chunk);
  layer_ms_.assign(specs.size(), 0.0);
}

uint64_t Model::kv_bytes_allocated() const {
  uint64_t n = 0;
  for (const auto& c : caches_) n += c.bytes();
  return n;
}

void Model::reset() {
  for (auto& c : caches_) c.reset();
}

void Model::clear_timings() { std::fill(layer_ms_.begin(), layer_ms_.end(), 0.0); }

void Model::forward(const float* x, const int32_t* positions, const uint8_t* real, int64_t T, float* y) {
  const int64_t B = opt_.batch, D = cfg_.hidden_size;
  // All or nothing: chunks run one after another through every layer, so a
  // chunk refused halfway would leave the earlier chunks (and, within a
  // chunk, the earlier layers) cached. Every layer's cache therefore checks
  // the whole call, every row split into the chunks below, before the first
  // chunk runs; the per-call checks inside run_block_cached then always pass.
  for (const LayerKvCache& c : caches_)
    for (int64_t b = 0; b < B; ++b)
      c.check_append(b, positions + b * T, real ? real + b * T : nullptr, T, opt_.chunk);
  for (int64_t t0 = 0; t0 < T; t0 += opt_.chunk) {
    const int64_t Tc = std::min(opt_.chunk, T - t0);
    cur_.resize(size_t(B * Tc * D));
    nxt_.resize(size_t(B * Tc * D));
    pos_.resize(size_t(B * Tc));
    real_.resize(size_t(B * Tc));
    for (int64_t b = 0; b < B; ++b) {
      std::copy_n(x + (b * T + t0) * D, Tc * D, cur_.data() + b * Tc * D);
      std::copy_n(positions + b * T + t0, Tc, pos_.data() + b * Tc);
      if (real) std::copy_n(real + b * T + t0, Tc, real_.data() + b * Tc);
    }
    for (size_t l = 0; l < layers_.size(); ++l) {
      const double t = now_ms();
      run_block_cached(layers_[l], caches_[l], cur_.data(), pos_.data(), real ? real_.data() : nullptr, B, Tc,
                       nxt_.data(), *pool_, scratch_);
      cur_.swap(nxt_);
      layer_ms_[l] += now_ms() - t;
      if (on_layer) on_layer(int(l), Tc);
    }
    for (int64_t b = 0; b < B; ++b) std::copy_n(cur_.data() + b * Tc * D, Tc * D, y + (b * T + t0) * D);
  }
}

}  // namespace g3
