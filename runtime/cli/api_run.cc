#include "runtime/cli/api_run.h"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <vector>

#include "generator/errors.h"
#include "runtime/api/run_layers.h"
#include "runtime/exec/run_driver.h"

namespace g3::cli {

namespace {

// The stack drive_run (run_driver.h) drives: every layer of the model as an
// API layer with its own library-owned cache (run_layers.h), each call one
// g3attn_block.
class ApiStack {
 public:
  ApiStack(const RunRequest& r, const g3attn_model* model, int64_t chunk)
      : B_(r.batch), D_(r.config.hidden_size), chunk_(chunk), context_(run_context(r, r.threads)),
        layers_(r, context_.get(), model, chunk) {
    api_check(g3attn_context_get_info(context_.get(), &info_));
    layer_ms_.assign(size_t(layers_.size()), 0.0);
  }

  int64_t num_layers() const { return layers_.size(); }
  const g3attn_context_info& info() const { return info_; }
  RunLayer route(int64_t l) const { return layers_.route(l); }
  uint64_t kv_bytes() const { return layers_.kv_bytes(); }

  // x and y [B][T][D], positions [B][T]: every layer in turn, on the
  // context's pool.
  void forward(const float* x, const int32_t* positions, const uint8_t* real, int64_t T, float* y) {
    // All or nothing, as the sharded stack (tp/sharded_stack.cc says why):
    // on calls of at most `chunk` tokens, layer 0 refuses whatever a later
    // layer would, before any cache is written.
    if (T > chunk_)
      throw InputError("a stack call of " + std::to_string(T) + " tokens per row is longer than the chunk of " +
                       std::to_string(chunk_) + " its caches were made for");
    const size_t n = size_t(B_ * T * D_);
    cur_.assign(x, x + n);
    nxt_.resize(n);
    for (int64_t l = 0; l < layers_.size(); ++l) {
      const double t0 = run_clock_ms();
      api_check(g3attn_block(layers_.layer(l), layers_.cache(l), cur_.data(), positions, real, B_, T, nxt_.data(),
                             nullptr, 0));
      layer_ms_[size_t(l)] += run_clock_ms() - t0;
      std::swap(cur_, nxt_);
      if (on_layer) on_layer(int(l), T);
    }
    std::copy(cur_.begin(), cur_.end(), y);
  }

  const std::vector<double>& layer_ms() const { return layer_ms_; }
  std::function<void(int, int64_t)> on_layer;

 private:
  int64_t B_, D_, chunk_;
  ApiHandle<g3attn_context> context_;
  g3attn_context_info info_{};
  RunLayers layers_;
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
