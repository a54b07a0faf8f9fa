// The C API's layers and the calls that run them: a whole layer or a head
// range (exec/head_range.h) prepared once (exec/block.h), then the block,
// the decode step, the attention part alone and the post-norm with the
// residual, with or without a KV cache.
#include <cstring>
#include <vector>

#include "runtime/api/api.h"
#include "runtime/reference/reference.h"

namespace g3::api {

namespace {

// Block scratch per calling thread: calls on different caches may run at
// once from different threads, and a thread's buffers are reused by its
// next call (the model stack reuses one buffer for every layer the same way).
thread_local BlockScratch t_scratch;

const Layer& layer_of(const g3attn_layer* l) { return *need(l, "layer")->s; }

void check_threads(int threads) {
  if (threads < 0 || threads > 1024)
    fail(G3ATTN_ERROR_ARGUMENT, "threads = " + std::to_string(threads) +
                                    " is outside 0..1024 (0: the context's pool, 1: the calling thread)");
}

void check_rows(int64_t batch, int64_t tokens, int64_t D) {
  if (batch < 1 || batch > (int64_t{1} << 20))
    fail(G3ATTN_ERROR_ARGUMENT, "batch = " + std::to_string(batch) + " is outside 1..2^20");
  if (tokens < 1 || tokens > (int64_t{1} << 24))
    fail(G3ATTN_ERROR_ARGUMENT, "tokens = " + std::to_string(tokens) + " is outside 1..2^24");
  // Keeps every size below in range of int64 and size_t arithmetic.
  if (batch * tokens > (int64_t{1} << 40) / D)
    fail(G3ATTN_ERROR_ARGUMENT, "batch x tokens x hidden_size is too large");
}

bool overlap(const float* a, const float* b, int64_t n) { return a < b + n && b < a + n; }

// The caches a layer may use: the same KV heads, head size, window kind and
// dtype (a cache made from one layer may serve another of the same shape).
void check_cache(const Layer& L, const g3attn_cache& c, int64_t batch) {
  const LayerSpec& a = L.prepared.spec;
  const LayerSpec& b = c.layer->prepared.spec;
  if (a.num_kv_heads != b.num_kv_heads || a.head_dim != b.head_dim || (a.window > 0) != (b.window > 0) ||
      a.window != b.window || c.kv->dtype() != L.prepared.key.kv_dtype)
    fail(G3ATTN_ERROR_ARGUMENT, "the cache was made for layer " + std::to_string(c.layer->full.index) + " (" +
                                    std::to_string(b.num_kv_heads) + " KV heads of " + std::to_string(b.head_dim) +
                                    ", window " + std::to_string(b.window) + ", " + to_string(c.kv->dtype()) +
                                    "), which does not match layer " + std::to_string(L.full.index) + " (" +
                                    std::to_string(a.num_kv_heads) + " KV heads of " + std::to_string(a.head_dim) +
                                    ", window " + std::to_string(a.window) + ", " +
                                    to_string(L.prepared.key.kv_dtype) + ")");
  if (c.kv->batch() != batch)
    fail(G3ATTN_ERROR_ARGUMENT, "batch = " + std::to_string(batch) + " but the cache holds " +
                                    std::to_string(c.kv->batch()) + " rows");
}

// Every run call: y (block output) and attn (attention output before the
// post-norm) may each be null, not both.
void run(const Layer& L, g3attn_cache* cache, const float* x, const int32_t* positions, const uint8_t* real,
         int64_t B, int64_t T, float* y, float* attn, int threads) {
  const LayerSpec& s = L.prepared.spec;
  const int64_t D = s.hidden_size;
  check_threads(threads);
  check_rows(B, T, D);
  const int64_t R = B * T, n = R * D;
  if (y && overlap(x, y, n)) fail(G3ATTN_ERROR_ARGUMENT, "y overlaps x");
  if (attn && overlap(x, attn, n)) fail(G3ATTN_ERROR_ARGUMENT, "attn overlaps x");
  if (attn && y && overlap(y, attn, n)) fail(G3ATTN_ERROR_ARGUMENT, "attn overlaps y");

  if (!cache) {
    // Keys are this call's tokens (g3attn apply's semantics).
    std::vector<int32_t> key_real(size_t(R), 1);
    if (real)
      for (int64_t i = 0; i < R; ++i) key_real[size_t(i)] = real[i] != 0;
    for (int64_t i = 0; i < R; ++i)
      if (key_real[size_t(i)] && positions[i] < 0)
        fail(G3ATTN_ERROR_ARGUMENT, "positions[" + std::to_string(i / T) + "][" + std::to_string(i % T) +
                                        "] = " + std::to_string(positions[i]) + " is negative for a real token");
    std::vector<float> y_tmp;
    float* yo = y;
    if (!yo) {
      y_tmp.resize(size_t(n));
      yo = y_tmp.data();
    }
    if (L.reference_weights) {
      // The official block: the dense caller mask (causal AND real keys).
      const std::vector<uint8_t> mask = ref::causal_mask(key_real.data(), B, T);
      ref::block(s, *L.reference_weights, x, positions, B, T, mask.data(), nullptr, yo, attn,
                 L.prepared.key.kv_dtype, L.prepared.key.compute);
    } else {
      run_block_nocache(L.prepared, x, positions, key_real.data(), B, T, yo, attn);
    }
    return;
  }
  check_cache(L, *cache, B);
  ThreadPool& pool = L.context->pool_for(threads);
  BlockScratch& S = t_scratch;
  // Refusals (positions, context, chunk) come from the cache's check before
  // anything is written: InputError, which guard maps to G3ATTN_ERROR_CACHE.
  run_block_cached(L.prepared, *cache->kv, x, positions, real, B, T, y, pool, S);
  if (attn) std::memcpy(attn, S.a.data(), size_t(n) * sizeof(float));
}

g3attn_status create(const char* fn, g3attn_context* context, const g3attn_model* model, int layer,
                     const g3attn_weights* weights, bool whole, int kv_begin, int kv_end, g3attn_layer** out) {
  return guard(fn, G3ATTN_ERROR_INPUT, [&] {
    need(out, "out");
    *out = nullptr;
    const std::shared_ptr<Context>& ctx = need(context, "context")->s;
    const ModelConfig& c = need(model, "model")->config;
    const Weights& w = *need(weights, "weights")->s;
    if (layer < 0 || layer >= c.num_layers)
      fail(G3ATTN_ERROR_ARGUMENT, "layer " + std::to_string(layer) + " is outside 0.." +
                                      std::to_string(c.num_layers - 1) + " of model " + c.name);
    const LayerSpec full = layer_spec(c, layer);
    const HeadRange r = whole ? HeadRange{0, full.num_kv_heads} : HeadRange{kv_begin, kv_end};
    LayerSpec spec;
    try {
      spec = head_range_spec(full, r);
    } catch (const InputError& e) {
      fail(G3ATTN_ERROR_ARGUMENT, e.what());
    }
    LayerWeights lw = w.load(full, r);
    auto L = std::make_shared<Layer>();
    L->context = ctx;
    L->full = full;
    L->range = r;
    L->prepared = prepare_layer(spec, lw, ctx->kv_dtype, ctx->backend, ctx->isa, ctx->compute, ctx->proj);
    if (ctx->backend == "reference") L->reference_weights = std::make_shared<const LayerWeights>(std::move(lw));
    L->key = L->prepared.key.str();
    L->backend = L->prepared.kernels.backend;
    L->decode_backend = L->prepared.decode.backend;
    L->isa = L->prepared.kernels.kernels.isa;
    L->fallback = L->prepared.kernels.fallback;
    auto h = std::make_unique<g3attn_layer>();
    h->s = std::move(L);
    *out = h.release();
  });
}

}  // namespace

}  // namespace g3::api

using namespace g3;
using namespace g3::api;

extern "C" {

g3attn_status g3attn_layer_create(g3attn_context* context, const g3attn_model* model, int layer,
                                  const g3attn_weights* weights, g3attn_layer** out) {
  return create("g3attn_layer_create", context, model, layer, weights, true, 0, 0, out);
}

g3attn_status g3attn_layer_create_heads(g3attn_context* context, const g3attn_model* model, int layer,
                                        const g3attn_weights* weights, int kv_begin, int kv_end,
                                        g3attn_layer** out) {
  return create("g3attn_layer_create_heads", context, model, layer, weights, false, kv_begin, kv_end, out);
}

void g3attn_layer_free(g3attn_layer* layer) { delete layer; }

g3attn_status g3attn_layer_describe(const g3attn_layer* layer, g3attn_layer_route* out) {
  return guard("g3attn_layer_describe", G3ATTN_ERROR_ARGUMENT, [&] {
    const Layer& L = layer_of(layer);
    need(out, "out");
    const LayerSpec& s = L.prepared.spec;
    g3attn_layer_route r{};
    r.key = L.key.c_str();
    r.backend = L.backend.c_str();
    r.decode_backend = L.decode_backend.c_str();
    r.isa = L.isa.c_str();
    r.fallback = L.fallback.c_str();
    r.specialised = L.prepared.kernels.kernels.specialised ? 1 : 0;
    r.index = s.index;
    r.kind = s.kind == LayerKind::Global ? G3ATTN_GLOBAL : G3ATTN_LOCAL;
    r.window = s.window;
    r.kv_begin = L.range.begin;
    r.kv_end = L.range.end;
    r.num_heads = s.num_heads;
    r.num_kv_heads = s.num_kv_heads;
    r.head_dim = s.head_dim;
    r.hidden_size = s.hidden_size;
    *out = r;
  });
}

g3attn_status g3attn_block(const g3attn_layer* layer, g3attn_cache* cache, const float* x, const int32_t* positions,
                           const uint8_t* real, int64_t batch, int64_t tokens, float* y, float* attn, int threads) {
  return guard("g3attn_block", G3ATTN_ERROR_CACHE, [&] {
    const Layer& L = layer_of(layer);
    need(x, "x");
    need(positions, "positions");
    if (!y && !attn) fail(G3ATTN_ERROR_NULL, "y and attn are both null (at least one output is needed)");
    run(L, cache, x, positions, real, batch, tokens, y, attn, threads);
  });
}

g3attn_status g3attn_decode(const g3attn_layer* layer, g3attn_cache* cache, const float* x, const int32_t* positions,
                            int64_t batch, float* y, int threads) {
  return guard("g3attn_decode", G3ATTN_ERROR_CACHE, [&] {
    const Layer& L = layer_of(layer);
    need(cache, "cache");
    need(x, "x");
    need(positions, "positions");
    need(y, "y");
    run(L, cache, x, positions, nullptr, batch, 1, y, nullptr, threads);
  });
}

g3attn_status g3attn_attention(const g3attn_layer* layer, g3attn_cache* cache, const float* x,
                               const int32_t* positions, const uint8_t* real, int64_t batch, int64_t tokens,
                               float* attn, int threads) {
  return guard("g3attn_attention", G3ATTN_ERROR_CACHE, [&] {
    const Layer& L = layer_of(layer);
    need(x, "x");
    need(positions, "positions");
    need(attn, "attn");
    run(L, cache, x, positions, real, batch, tokens, nullptr, attn, threads);
  });
}

g3attn_status g3attn_finish(const g3attn_layer* layer, const float* x, const float* attn, int64_t rows, float* y,
                            int threads) {
  return guard("g3attn_finish", G3ATTN_ERROR_ARGUMENT, [&] {
    const Layer& L = layer_of(layer);
    need(x, "x");
    need(attn, "attn");
    need(y, "y");
    check_threads(threads);
    const LayerSpec& s = L.prepared.spec;
    const int64_t D = s.hidden_size;
    check_rows(1, rows, D);
    // The kernels read a row before they write it, element by element, so y
    // may be x or attn exactly; a partial overlap would mix rows.
    if (y != x && y != attn && (overlap(y, x, rows * D) || overlap(y, attn, rows * D)))
      fail(G3ATTN_ERROR_ARGUMENT, "y partly overlaps x or attn (it may be either one exactly)");
    const g3_kernel_table& k = L.prepared.kernels.kernels.table;
    ThreadPool& pool = L.context->pool_for(threads);
    const int64_t tb = BlockSplit{}.token_block, nb = (rows + tb - 1) / tb;
    // SPEC 1.2 steps 3-4: the post-norm of the attention output, plus x.
    pool.parallel_for(nb, [&](int64_t i) {
      const int64_t r0 = i * tb, r1 = std::min(rows, r0 + tb);
      k.rmsnorm(attn + r0 * D, r1 - r0, D, D, L.prepared.post_norm.data(), s.rms_eps, x + r0 * D, y + r0 * D, D);
    });
  });
}

}  // extern "C"
