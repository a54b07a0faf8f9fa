// The C API's KV caches: exec/kv_cache.h's LayerKvCache for one layer (or
// head range), over memory the library allocates or the caller provides.
#include "runtime/api/api.h"

namespace g3::api {

namespace {

const Layer& layer_of(const g3attn_layer* l) { return *need(l, "layer")->s; }

void check_sizes(int64_t batch, int64_t context, int64_t chunk) {
  if (batch < 1 || batch > (int64_t{1} << 20))
    fail(G3ATTN_ERROR_ARGUMENT, "batch = " + std::to_string(batch) + " is outside 1..2^20");
  if (context < 1 || context > std::numeric_limits<int32_t>::max())
    fail(G3ATTN_ERROR_ARGUMENT, "context = " + std::to_string(context) + " is outside 1..2^31-1");
  if (chunk < 1 || chunk > std::numeric_limits<int32_t>::max())
    fail(G3ATTN_ERROR_ARGUMENT, "chunk = " + std::to_string(chunk) + " is outside 1..2^31-1");
}

int64_t slots_for(const LayerSpec& s, int64_t context, int64_t chunk) {
  return s.window > 0 ? ring_slots(s.window, chunk, context) : context;
}

// K (or V) bytes of a cache; refuses sizes past what any machine holds, so
// the products below cannot overflow.
uint64_t buffer_bytes(const Layer& L, int64_t batch, int64_t context, int64_t chunk) {
  const LayerSpec& s = L.prepared.spec;
  const double bytes = double(batch) * double(s.num_kv_heads) * double(slots_for(s, context, chunk)) *
                       double(s.head_dim) * (L.prepared.key.kv_dtype == DType::F32 ? 4.0 : 2.0);
  if (bytes > double(int64_t{1} << 50)) fail(G3ATTN_ERROR_MEMORY, "the cache would need " + std::to_string(bytes) + " bytes");
  return uint64_t(batch) * uint64_t(s.num_kv_heads) * uint64_t(slots_for(s, context, chunk)) *
         uint64_t(s.head_dim) * (L.prepared.key.kv_dtype == DType::F32 ? 4u : 2u);
}

}  // namespace

}  // namespace g3::api

using namespace g3;
using namespace g3::api;

extern "C" {

g3attn_status g3attn_cache_slots(const g3attn_layer* layer, int64_t context, int64_t chunk, int64_t* slots) {
  return guard("g3attn_cache_slots", G3ATTN_ERROR_ARGUMENT, [&] {
    const Layer& L = layer_of(layer);
    need(slots, "slots");
    check_sizes(1, context, chunk);
    *slots = slots_for(L.prepared.spec, context, chunk);
  });
}

g3attn_status g3attn_cache_create(const g3attn_layer* layer, int64_t batch, int64_t context, int64_t chunk,
                                  g3attn_cache** out) {
  return guard("g3attn_cache_create", G3ATTN_ERROR_ARGUMENT, [&] {
    need(out, "out");
    *out = nullptr;
    const Layer& L = layer_of(layer);
    check_sizes(batch, context, chunk);
    buffer_bytes(L, batch, context, chunk);
    auto c = std::make_unique<g3attn_cache>();
    c->layer = layer->s;
    c->kv = std::make_unique<LayerKvCache>(L.prepared.spec, L.prepared.key.kv_dtype, batch, context, chunk);
    *out = c.release();
  });
}

g3attn_status g3attn_cache_wrap(const g3attn_layer* layer, int64_t batch, int64_t context, int64_t chunk, void* k,
                                void* v, size_t bytes, g3attn_cache** out) {
  return guard("g3attn_cache_wrap", G3ATTN_ERROR_ARGUMENT, [&] {
    need(out, "out");
    *out = nullptr;
    const Layer& L = layer_of(layer);
    need(k, "k");
    need(v, "v");
    check_sizes(batch, context, chunk);
    const uint64_t want = buffer_bytes(L, batch, context, chunk);
    if (uint64_t(bytes) != want)
      fail(G3ATTN_ERROR_ARGUMENT,
           "bytes = " + std::to_string(bytes) + " but the cache needs " + std::to_string(want) + " per buffer (" +
               std::to_string(batch) + " rows x " + std::to_string(L.prepared.spec.num_kv_heads) + " KV heads x " +
               std::to_string(slots_for(L.prepared.spec, context, chunk)) + " slots x " +
               std::to_string(L.prepared.spec.head_dim) + " x " +
               (L.prepared.key.kv_dtype == DType::F32 ? "4" : "2") + " bytes)");
    const size_t esz = L.prepared.key.kv_dtype == DType::F32 ? 4 : 2;
    if (reinterpret_cast<uintptr_t>(k) % esz || reinterpret_cast<uintptr_t>(v) % esz)
      fail(G3ATTN_ERROR_ARGUMENT, "k and v must be aligned to their element size (" + std::to_string(esz) +
                                      " bytes; 64 is best)");
    const auto* kb = static_cast<const uint8_t*>(k);
    const auto* vb = static_cast<const uint8_t*>(v);
    if (kb < vb + bytes && vb < kb + bytes) fail(G3ATTN_ERROR_ARGUMENT, "k and v overlap");
    auto c = std::make_unique<g3attn_cache>();
    c->layer = layer->s;
    c->kv = std::make_unique<LayerKvCache>(L.prepared.spec, L.prepared.key.kv_dtype, batch, context, chunk, k, v);
    *out = c.release();
  });
}

g3attn_status g3attn_cache_reset(g3attn_cache* cache) {
  return guard("g3attn_cache_reset", G3ATTN_ERROR_ARGUMENT, [&] { need(cache, "cache")->kv->reset(); });
}

void g3attn_cache_free(g3attn_cache* cache) { delete cache; }

g3attn_status g3attn_cache_row(const g3attn_cache* cache, int64_t row, g3attn_cache_view* out) {
  return guard("g3attn_cache_row", G3ATTN_ERROR_ARGUMENT, [&] {
    const LayerKvCache& c = *need(cache, "cache")->kv;
    need(out, "out");
    if (row < 0 || row >= c.batch())
      fail(G3ATTN_ERROR_ARGUMENT, "row " + std::to_string(row) + " is outside 0.." + std::to_string(c.batch() - 1));
    const LayerSpec& s = cache->layer->prepared.spec;
    g3attn_cache_view w{};
    w.k = c.k(row);
    w.v = c.v(row);
    w.positions = c.kpos(row);
    w.valid = c.kvalid(row);
    w.slots = c.capacity();
    w.written = c.written(row);
    w.last_position = c.last_position(row);
    w.num_kv_heads = s.num_kv_heads;
    w.head_dim = s.head_dim;
    w.dtype = c.dtype() == DType::BF16 ? G3ATTN_BF16 : G3ATTN_F32;
    w.ring = c.is_ring() ? 1 : 0;
    *out = w;
  });
}

g3attn_status g3attn_cache_bytes(const g3attn_cache* cache, uint64_t* bytes) {
  return guard("g3attn_cache_bytes", G3ATTN_ERROR_ARGUMENT, [&] {
    const LayerKvCache& c = *need(cache, "cache")->kv;
    need(bytes, "bytes");
    *bytes = c.bytes();
  });
}

}  // extern "C"
