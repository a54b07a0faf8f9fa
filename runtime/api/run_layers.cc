#include "runtime/api/run_layers.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

namespace g3 {

ApiHandle<g3attn_context> run_context(const RunRequest& r, int threads) {
  g3attn_options* o = nullptr;
  api_check(g3attn_options_create(&o));
  const ApiHandle<g3attn_options> options(o);
  api_check(g3attn_options_set_backend(o, r.backend.c_str()));
  if (!r.isa.empty()) api_check(g3attn_options_set_isa(o, r.isa.c_str()));
  api_check(g3attn_options_set_kv_dtype(o, api_dtype(r.kv_dtype)));
  api_check(g3attn_options_set_compute(o, api_dtype(r.compute)));
  api_check(g3attn_options_set_projections(o, to_string(r.proj)));
  api_check(g3attn_options_set_threads(o, threads));
  g3attn_context* c = nullptr;
  api_check(g3attn_context_create(o, &c));
  return ApiHandle<g3attn_context>(c);
}

RunLayers::RunLayers(const RunRequest& r, g3attn_context* context, const g3attn_model* model, int64_t chunk,
                     std::optional<HeadRange> range) {
  g3attn_context_info info{};
  api_check(g3attn_context_get_info(context, &info));
  g3attn_weights* w = nullptr;
  if (r.weights.empty()) api_check(g3attn_weights_random(r.seed, api_dtype(r.weight_dtype), &w));
  else api_check(g3attn_weights_open(r.weights.c_str(), model, &w));
  const ApiHandle<g3attn_weights> weights(w);

  // Reading or drawing and packing a layer's weights is independent of the
  // other layers (g3attn.h: layers may be made from several threads at
  // once), so the layers are made on as many threads as the pool has.
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
        if (range) api_check(g3attn_layer_create_heads(context, model, l, w, range->begin, range->end, &lp));
        else api_check(g3attn_layer_create(context, model, l, w, &lp));
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
  for (int t = 1; t < std::min(info.threads, nl); ++t) helpers.emplace_back(work);
  work();
  for (auto& t : helpers) t.join();
  if (err) std::rethrow_exception(err);
}

RunLayer RunLayers::route(int64_t l) const {
  g3attn_layer_route g{};
  api_check(g3attn_layer_describe(layer(l), &g));
  RunLayer rl;
  rl.index = g.index;
  rl.kind = g.kind == G3ATTN_GLOBAL ? LayerKind::Global : LayerKind::Local;
  rl.key = g.key;
  rl.backend = g.backend;
  rl.isa = g.isa;
  rl.specialised = g.specialised != 0;
  return rl;
}

uint64_t RunLayers::kv_bytes() const {
  uint64_t total = 0;
  for (const auto& c : caches_) {
    uint64_t n = 0;
    api_check(g3attn_cache_bytes(c.get(), &n));
    total += n;
  }
  return total;
}

}  // namespace g3
