// The C API's model descriptions, options and contexts: the catalogue's
// ModelConfig and LayerSpec behind g3attn_model, and the resolved options
// with their thread pools behind g3attn_context.
#include <cstring>

#include "runtime/api/api.h"
#include "runtime/dispatch/isa.h"

namespace g3::api {

ThreadPool& Context::pool_for(int threads) {
  if (threads == 0) return *pool;
  if (threads == 1) {
    // No workers: parallel_for runs every item on the calling thread, and
    // no pool is shared with other callers.
    thread_local ThreadPool solo(1);
    return solo;
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<ThreadPool>& p = sized_[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

namespace {

const ModelConfig& config_of(const g3attn_model* m) { return need(m, "model")->config; }

LayerSpec spec_of(const g3attn_model* m, int layer) {
  const ModelConfig& c = config_of(m);
  if (layer < 0 || layer >= c.num_layers)
    fail(G3ATTN_ERROR_ARGUMENT, "layer " + std::to_string(layer) + " is outside 0.." + std::to_string(c.num_layers - 1) +
                                    " of model " + c.name);
  return layer_spec(c, layer);
}

g3attn_options& options_of(g3attn_options* o) { return *need(o, "options"); }

}  // namespace

}  // namespace g3::api

using namespace g3;
using namespace g3::api;

extern "C" {

g3attn_status g3attn_model_builtin(const char* name, g3attn_model** out) {
  return guard("g3attn_model_builtin", G3ATTN_ERROR_NAME, [&] {
    need(out, "out");
    *out = nullptr;
    auto m = std::make_unique<g3attn_model>();
    m->config = builtin_model(need(name, "name"));
    *out = m.release();
  });
}

g3attn_status g3attn_model_from_json(const char* json, g3attn_model** out) {
  return guard("g3attn_model_from_json", G3ATTN_ERROR_INPUT, [&] {
    need(out, "out");
    *out = nullptr;
    auto m = std::make_unique<g3attn_model>();
    m->config = parse_config_json(need(json, "json"), "config.json text");
    *out = m.release();
  });
}

g3attn_status g3attn_model_load(const char* config_path, g3attn_model** out) {
  return guard("g3attn_model_load", G3ATTN_ERROR_INPUT, [&] {
    need(out, "out");
    *out = nullptr;
    auto m = std::make_unique<g3attn_model>();
    m->config = load_config_file(need(config_path, "config_path"));
    *out = m.release();
  });
}

void g3attn_model_free(g3attn_model* model) { delete model; }

g3attn_status g3attn_model_get_info(const g3attn_model* model, g3attn_model_info* out) {
  return guard("g3attn_model_get_info", G3ATTN_ERROR_ARGUMENT, [&] {
    const ModelConfig& c = config_of(model);
    need(out, "out");
    g3attn_model_info i{};
    i.name = c.name.c_str();
    i.hidden_size = c.hidden_size;
    i.num_layers = c.num_layers;
    i.num_heads = c.num_heads;
    i.num_kv_heads = c.num_kv_heads;
    i.head_dim = c.head_dim;
    i.sliding_window = c.sliding_window;
    i.max_position_embeddings = c.max_position_embeddings;
    i.layer_index = c.layer_index ? *c.layer_index : -1;
    *out = i;
  });
}

g3attn_status g3attn_model_layer(const g3attn_model* model, int layer, g3attn_layer_info* out) {
  return guard("g3attn_model_layer", G3ATTN_ERROR_ARGUMENT, [&] {
    const LayerSpec s = spec_of(model, layer);
    need(out, "out");
    g3attn_layer_info i{};
    i.index = s.index;
    i.kind = s.kind == LayerKind::Global ? G3ATTN_GLOBAL : G3ATTN_LOCAL;
    i.window = s.window;
    i.num_heads = s.num_heads;
    i.num_kv_heads = s.num_kv_heads;
    i.head_dim = s.head_dim;
    i.hidden_size = s.hidden_size;
    i.rope_base = s.rope_base;
    i.rope_scale = s.rope_scale;
    i.alpha = s.alpha;
    i.rms_eps = s.rms_eps;
    *out = i;
  });
}

g3attn_status g3attn_model_layer_key(const g3attn_model* model, int layer, g3attn_dtype kv_dtype,
                                     g3attn_dtype weight_dtype, g3attn_dtype compute, char* buf, size_t size) {
  return guard("g3attn_model_layer_key", G3ATTN_ERROR_ARGUMENT, [&] {
    const LayerSpec s = spec_of(model, layer);
    const DType kv = to_dtype(enum_value(kv_dtype), "kv_dtype"), c = to_dtype(enum_value(compute), "compute");
    // As a layer is prepared: the bf16 compute mode packs its weights as bf16.
    const DType w = c == DType::BF16 ? DType::BF16 : to_dtype(enum_value(weight_dtype), "weight_dtype");
    need(buf, "buf");
    const std::string key = kernel_key(s, kv, w, c).str();
    if (key.size() + 1 > size)
      fail(G3ATTN_ERROR_ARGUMENT, "buf holds " + std::to_string(size) + " bytes; the key needs " +
                                      std::to_string(key.size() + 1) + " (G3ATTN_KEY_MAX is enough)");
    std::memcpy(buf, key.c_str(), key.size() + 1);
  });
}

g3attn_status g3attn_options_create(g3attn_options** out) {
  return guard("g3attn_options_create", G3ATTN_ERROR_ARGUMENT, [&] {
    need(out, "out");
    *out = new g3attn_options();
  });
}

void g3attn_options_free(g3attn_options* options) { delete options; }

g3attn_status g3attn_options_set_backend(g3attn_options* options, const char* backend) {
  return guard("g3attn_options_set_backend", G3ATTN_ERROR_NAME, [&] {
    g3attn_options& o = options_of(options);
    o.backend = backend_name(need(backend, "backend"));
  });
}

g3attn_status g3attn_options_set_isa(g3attn_options* options, const char* isa) {
  return guard("g3attn_options_set_isa", G3ATTN_ERROR_NAME, [&] {
    g3attn_options& o = options_of(options);
    const std::string name = need(isa, "isa");
    if (name.empty()) fail(G3ATTN_ERROR_NAME, "the ISA name is empty (use \"best\")");
    resolve_isa_name(name);  // refuses unknown and unrunnable names now, not at context creation
    o.isa = name;
  });
}

g3attn_status g3attn_options_set_kv_dtype(g3attn_options* options, g3attn_dtype kv_dtype) {
  return guard("g3attn_options_set_kv_dtype", G3ATTN_ERROR_ARGUMENT, [&] {
    g3attn_options& o = options_of(options);
    o.kv_dtype = to_dtype(enum_value(kv_dtype), "kv_dtype");
  });
}

g3attn_status g3attn_options_set_compute(g3attn_options* options, g3attn_dtype compute) {
  return guard("g3attn_options_set_compute", G3ATTN_ERROR_ARGUMENT, [&] {
    g3attn_options& o = options_of(options);
    o.compute = to_dtype(enum_value(compute), "compute");
  });
}

g3attn_status g3attn_options_set_threads(g3attn_options* options, int threads) {
  return guard("g3attn_options_set_threads", G3ATTN_ERROR_ARGUMENT, [&] {
    g3attn_options& o = options_of(options);
    if (threads < 0 || threads > 1024)
      fail(G3ATTN_ERROR_ARGUMENT, "threads = " + std::to_string(threads) + " is outside 0..1024 (0: every core)");
    o.threads = threads;
  });
}

g3attn_status g3attn_options_set_projections(g3attn_options* options, const char* provider) {
  return guard("g3attn_options_set_projections", G3ATTN_ERROR_NAME, [&] {
    g3attn_options& o = options_of(options);
    const std::string name = need(provider, "provider");
    if (name != "auto" && name != "highway" && name != "onednn")
      fail(G3ATTN_ERROR_NAME, "unknown projection provider '" + name + "' (valid: auto, highway, onednn)");
    o.proj = parse_projection_route(name);
  });
}

g3attn_status g3attn_context_create(const g3attn_options* options, g3attn_context** out) {
  return guard("g3attn_context_create", G3ATTN_ERROR_NAME, [&] {
    need(out, "out");
    *out = nullptr;
    const g3attn_options defaults;
    const g3attn_options& o = options ? *options : defaults;
    auto c = std::make_shared<Context>();
    c->backend = backend_name(o.backend);
    c->isa = resolve_isa_name(o.isa);
    c->kv_dtype = o.kv_dtype;
    c->compute = o.compute;
    c->proj = o.proj;
    c->pool = std::make_unique<ThreadPool>(o.threads);
    auto h = std::make_unique<g3attn_context>();
    h->s = std::move(c);
    *out = h.release();
  });
}

void g3attn_context_free(g3attn_context* context) { delete context; }

g3attn_status g3attn_context_get_info(const g3attn_context* context, g3attn_context_info* out) {
  return guard("g3attn_context_get_info", G3ATTN_ERROR_ARGUMENT, [&] {
    const Context& c = *need(context, "context")->s;
    need(out, "out");
    g3attn_context_info i{};
    i.backend = c.backend.c_str();
    i.isa = c.isa.c_str();
    i.kv_dtype = c.kv_dtype == DType::BF16 ? G3ATTN_BF16 : G3ATTN_F32;
    i.compute = c.compute == DType::BF16 ? G3ATTN_BF16 : G3ATTN_F32;
    i.threads = c.pool->size();
    *out = i;
  });
}

}  // extern "C"
