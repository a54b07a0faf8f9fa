#include "runtime/cli/api_run.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/exec/run_driver.h"
#include "runtime/io/checkpoint.h"

namespace g3::cli {

namespace {

g3attn_dtype api_dtype(DType d) { return d == DType::BF16 ? G3ATTN_BF16 : G3ATTN_F32; }

// The stack drive_run (run_driver.h) drives: every layer of the model as an
// API layer with its own library-owned cache.
class ApiStack {
 public:
  ApiStack(const RunRequest& r, const g3attn_model* model, int64_t chunk) : B_(r.batch), D_(r.config.hidden_size) {
    g3attn_options* o = nullptr;
    api_check(g3attn_options_create(&o));
    ApiHandle<g3attn_options> options(o);
    api_check(g3attn_options_set_backend(o, r.backend.c_str()));
    // No --isa: the options' default, $G3ATTN_ISA else best.
    if (!r.isa.empty()) api_check(g3attn_options_set_isa(o, r.isa.c_str()));
    api_check(g3attn_options_set_kv_dtype(o, api_dtype(r.kv_dtype)));
    api_check(g3attn_options_set_compute(o, api_dtype(r.compute)));
    api_check(g3attn_options_set_projections(o, to_string(r.proj)));
    api_check(g3attn_options_set_threads(o, r.threads));
    g3attn_context* c = nullptr;
    api_check(g3attn_context_create(o, &c));
    context_.reset(c);
    api_check(g3attn_context_get_info(c, &info_));

    g3attn_weights* w = nullptr;
    if (r.weights.empty()) api_check(g3attn_weights_random(r.seed, api_dtype(r.weight_dtype), &w));
    else api_check(g3attn_weights_open(r.weights.c_str(), model, &w));
    ApiHandle<g3attn_weights> weights(w);

    // Reading or drawing and packing a layer's weights is independent of
    // the other layers (g3attn.h: layers may be made from several threads
    // at once), so the layers are made on as many threads as the pool has.
    const int nl = r.config.num_layers;
    layers_.resize(size_t(nl));
    caches_.resize(size_t(nl));
    std::atomic<int> next{0};
    std::mutex mu;
    std::exception_ptr err;
    auto work = [&] {
      for (int l = next++; l < nl; l = next++) {
        try {
          g3attn_layer* lp = nullptr;
          api_check(g3attn_layer_create(c, model, l, w, &lp));
          layers_[size_t(l)].reset(lp);
          g3attn_cache* cp = nullptr;
          api_check(g3attn_cache_create(lp, r.batch, r.prompt + r.decode, chunk, &cp));
          caches_[size_t(l)].reset(cp);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!err) err = std::current_exception();
        }
      }
    };
    std::vector<std::thread> helpers;
    for (int t = 1; t < std::min(info_.threads, nl); ++t) helpers.emplace_back(work);
    work();
    for (auto& t : helpers) t.join();
    if (err) std::rethrow_exception(err);
    layer_ms_.assign(size_t(nl), 0.0);
  }

  int64_t num_layers() const { return int64_t(layers_.size()); }
  const g3attn_context_info& info() const { return info_; }

  RunLayer route(int64_t l) const {
    g3attn_layer_route g{};
    api_check(g3attn_layer_describe(layers_[size_t(l)].get(), &g));
    RunLayer rl;
    rl.index = g.index;
    rl.kind = g.kind == G3ATTN_GLOBAL ? LayerKind::Global : LayerKind::Local;
    rl.key = g.key;
    rl.backend = g.backend;
    rl.isa = g.isa;
    rl.specialised = g.specialised != 0;
    return rl;
  }

  uint64_t kv_bytes() const {
    uint64_t total = 0;
    for (const auto& c : caches_) {
      uint64_t n = 0;
      api_check(g3attn_cache_bytes(c.get(), &n));
      total += n;
    }
    return total;
  }

  // x and y [B][T][D], positions [B][T]: every layer in turn, on the
  // context's pool.
  void forward(const float* x, const int32_t* positions, const uint8_t* real, int64_t T, float* y) {
    const size_t n = size_t(B_ * T * D_);
    cur_.assign(x, x + n);
    nxt_.resize(n);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const double t0 = run_clock_ms();
      api_check(g3attn_block(layers_[l].get(), caches_[l].get(), cur_.data(), positions, real, B_, T, nxt_.data(),
                             nullptr, 0));
      layer_ms_[l] += run_clock_ms() - t0;
      std::swap(cur_, nxt_);
      if (on_layer) on_layer(int(l), T);
    }
    std::copy(cur_.begin(), cur_.end(), y);
  }

  const std::vector<double>& layer_ms() const { return layer_ms_; }
  std::function<void(int, int64_t)> on_layer;

 private:
  int64_t B_, D_;
  ApiHandle<g3attn_context> context_;
  g3attn_context_info info_{};
  std::vector<ApiHandle<g3attn_layer>> layers_;
  std::vector<ApiHandle<g3attn_cache>> caches_;
  std::vector<double> layer_ms_;
  std::vector<float> cur_, nxt_;
};

}  // namespace

ApiHandle<g3attn_model> api_model(const Args& a) {
  g3attn_model* m = nullptr;
  if (a.has("weights") && !a.has("model") && !a.has("config")) {
    g3attn_weights* w = nullptr;
    api_check(g3attn_weights_open(a.str("weights").c_str(), nullptr, &w));
    ApiHandle<g3attn_weights> weights(w);
    api_check(g3attn_model_from_weights(w, &m));
  } else if (a.has("config")) {
    api_check(g3attn_model_load(a.str("config").c_str(), &m));
  } else {
    api_check(g3attn_model_builtin(a.has("model") ? a.str("model").c_str() : "1b", &m));
  }
  return ApiHandle<g3attn_model>(m);
}

RunResult run_through_api(const RunRequest& r, const g3attn_model* model) {
  check_run_request(r);
  const ModelConfig& cfg = r.config;
  const int64_t chunk = std::min(r.chunk, r.prompt);
  ApiStack stack(r, model, chunk);

  RunResult res;
  res.config = cfg;
  res.isa = stack.info().isa;
  res.threads = stack.info().threads;
  res.kv = kv_bytes(cfg, r.prompt + r.decode, r.batch, r.kv_dtype, chunk);
  if (res.kv.ring != stack.kv_bytes()) throw std::logic_error("kv_bytes accounting disagrees with the API's caches");
  // Decode step i (from 0) sees prompt + i + 1 positions: the mean is
  // prompt + (decode + 1) / 2. The weights as the layers hold them: the key
  // names their dtype (bf16 compute packs them as bf16 whatever the source).
  const bool bf16_weights = stack.route(0).key.ends_with("_wbf16");
  res.decode_traffic = decode_traffic(cfg, bf16_weights ? DType::BF16 : DType::F32, r.kv_dtype, r.batch,
                                      r.prompt + (r.decode + 1) / 2);

  const RunInputs in = run_inputs(r);
  drive_run(stack, r, in, chunk, res);
  if (r.verify) {
    ThreadPool pool(r.threads);
    verify_against_reference(r, run_weight_source(r), pool, in, res);
  }
  return res;
}

}  // namespace g3::cli
