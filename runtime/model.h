// The attention stack of a whole model: every layer's block routed to its
// kernel under the 5:1 local/global pattern (layers with equal kernel keys
// share one kernel), KV caches (kv_cache.h), chunked prefill and decode over a
// batch with per-row positions and padding, all on one thread pool. The MLPs,
// embeddings and logits are not part of it: the hidden state flows from block
// to block, y = x + RMSNorm(Attention(RMSNorm(x))) (SPEC 1.2 steps 1-4).
//
// Also here: the official reference stack used by `g3attn run --verify`, and
// run_model, the library side of `g3attn run`.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "block.h"
#include "catalogue.h"
#include "kv_cache.h"
#include "layer_weights.h"
#include "reference.h"
#include "thread_pool.h"

namespace g3 {

// A layer's weights on demand (random from a seed, or read from a checkpoint).
using WeightSource = std::function<LayerWeights(const LayerSpec&)>;

struct ModelOptions {
  std::string backend = "auto";
  std::string isa = "best";     // an ISA name of isa.h; "best" is resolved here
  DType kv_dtype = DType::F32;
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

// The official layout in double precision (SPEC 1.3-1.6), for verification:
// every layer has a full-length ref::Cache of `cache_len` slots; a call's T
// tokens (padding included) are written at slots end_index .. end_index+T-1
// and the caller mask is the official one, mask[b][t][s] = slot s holds a real
// token AND s <= end_index + t, with the sliding mask on local layers and
// K_MASK replacement, softmax over all slots. The same arithmetic as
// ref::attention / ref::block (weights widened to f32 once, not per call),
// split over rows and heads on the pool. kv_dtype as in ref::attention: bf16
// rounds each K and V element once as it enters the cache.
class ReferenceStack {
 public:
  ReferenceStack(const ModelConfig& cfg, const WeightSource& weights, int64_t batch, int64_t cache_len,
                 ThreadPool& pool, DType kv_dtype = DType::F32);
  void forward(const float* x, const int32_t* positions, const uint8_t* real, int64_t T, float* y);
  std::function<void(int)> on_layer;

 private:
  struct Layer {
    LayerSpec spec;
    std::vector<float> wq, wk, wv, wo, q_norm, k_norm, input_norm, post_norm;
    ref::Cache cache;
  };
  void block(Layer& L, const float* x, const int32_t* pos, int64_t T, int64_t start, float* y);
  ModelConfig cfg_;
  int64_t B_, S_;
  ThreadPool& pool_;
  DType kv_dtype_;
  std::vector<Layer> layers_;
  std::vector<uint8_t> slot_real_;  // [B][S]
  int64_t end_index_ = 0;
};

// What `g3attn run` does, as a library call.
struct RunRequest {
  ModelConfig config;
  std::string weights;              // "" = random weights from `seed`
  DType weight_dtype = DType::BF16; // random weights only
  uint64_t seed = 0;
  int64_t prompt = 2048, decode = 32, chunk = 512, batch = 1;
  int threads = 0;
  std::string backend = "auto";
  std::string isa;                  // the --isa flag ("" = $G3ATTN_ISA or best)
  DType kv_dtype = DType::F32;
  bool verify = false;
  // Progress: phase ("prefill", "decode", "verify"), done, total.
  std::function<void(const std::string&, int64_t, int64_t)> progress;
};

struct RunLayer {
  int index = 0;
  LayerKind kind = LayerKind::Local;
  std::string key, backend, isa;
  bool specialised = true;
  double prefill_ms = 0, decode_ms = 0;
};

struct RunResult {
  ModelConfig config;
  std::string isa;
  int threads = 0;
  double prefill_s = 0, decode_s = 0;
  double prefill_tokens_per_s = 0, decode_ms_per_token = 0;
  double local_ms = 0, global_ms = 0;
  KvBytes kv;                       // ring (allocated) vs the official full length
  std::vector<RunLayer> layers;
  bool verified = false;
  double verify_s = 0;
  double max_abs_diff = 0, max_abs_diff_prefill = 0, max_abs_diff_decode = 0;
  std::vector<float> final_hidden;  // [B][prompt + decode][D] of the last layer
};

RunResult run_model(const RunRequest& r);
// Every check run_model makes before allocating anything: sizes, positions
// against max_position_embeddings, and memory (KV caches and weights must
// fit this machine's RAM). Throws InputError; cheap, so callers may run it
// before printing anything.
void check_run_request(const RunRequest& r);

}  // namespace g3
