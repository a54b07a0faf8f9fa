#include "tests/api/api_test_util.h"

#include "runtime/io/npy.h"
#include "tests/support/test_support.h"

namespace g3apitest {

Model builtin(const char* name) {
  g3attn_model* m = nullptr;
  API_OK(g3attn_model_builtin(name, &m));
  return Model(m);
}

Model load_model(const std::string& config_path) {
  g3attn_model* m = nullptr;
  API_OK(g3attn_model_load(config_path.c_str(), &m));
  return Model(m);
}

Model model_from_json(const std::string& json) {
  g3attn_model* m = nullptr;
  API_OK(g3attn_model_from_json(json.c_str(), &m));
  return Model(m);
}

Context context(const char* backend, g3attn_dtype kv, g3attn_dtype compute, int threads) {
  g3attn_options* o = nullptr;
  API_OK(g3attn_options_create(&o));
  Options opts(o);
  API_OK(g3attn_options_set_backend(o, backend));
  API_OK(g3attn_options_set_kv_dtype(o, kv));
  API_OK(g3attn_options_set_compute(o, compute));
  API_OK(g3attn_options_set_threads(o, threads));
  g3attn_context* c = nullptr;
  API_OK(g3attn_context_create(o, &c));
  return Context(c);
}

Weights open_weights(const std::string& path, const g3attn_model* model) {
  g3attn_weights* w = nullptr;
  API_OK(g3attn_weights_open(path.c_str(), model, &w));
  return Weights(w);
}

Weights random_weights(uint64_t seed, g3attn_dtype dtype) {
  g3attn_weights* w = nullptr;
  API_OK(g3attn_weights_random(seed, dtype, &w));
  return Weights(w);
}

Layer make_layer(g3attn_context* c, const g3attn_model* m, int layer, const g3attn_weights* w) {
  g3attn_layer* l = nullptr;
  API_OK(g3attn_layer_create(c, m, layer, w, &l));
  return Layer(l);
}

Layer make_heads(g3attn_context* c, const g3attn_model* m, int layer, const g3attn_weights* w, int j0, int j1) {
  g3attn_layer* l = nullptr;
  API_OK(g3attn_layer_create_heads(c, m, layer, w, j0, j1, &l));
  return Layer(l);
}

Cache make_cache(const g3attn_layer* l, int64_t batch, int64_t context, int64_t chunk) {
  g3attn_cache* c = nullptr;
  API_OK(g3attn_cache_create(l, batch, context, chunk, &c));
  return Cache(c);
}

Golden read_golden(const std::string& name) {
  Golden g;
  g.dir = g3test::golden_dir() + "/" + name;
  const g3::NpyArray x = g3::read_npy_f32(g3test::golden_file(name, "x.npy"));
  const g3::NpyArray p = g3::read_npy_i32(g3test::golden_file(name, "positions.npy"));
  const g3::NpyArray m = g3::read_npy_i32(g3test::golden_file(name, "attention_mask.npy"));
  const g3::NpyArray a = g3::read_npy_f32(g3test::golden_file(name, "attn_out.npy"));
  const g3::NpyArray y = g3::read_npy_f32(g3test::golden_file(name, "block_out.npy"));
  REQUIRE(x.shape.size() == 3);
  g.B = x.shape[0];
  g.T = x.shape[1];
  g.D = x.shape[2];
  g.x = x.f32;
  g.attn_out = a.f32;
  g.block_out = y.f32;
  g.positions = p.i32;
  for (int32_t v : m.i32) {
    g.real.push_back(v != 0);
    g.real_row.push_back(v != 0);
  }
  REQUIRE(g.positions.size() == size_t(g.B * g.T));
  REQUIRE(g.real.size() == size_t(g.B * g.T));
  g3attn_model* mp = nullptr;
  API_OK(g3attn_model_load(g3test::golden_file(name, "config.json").c_str(), &mp));
  Model model(mp);
  g3attn_model_info info;
  API_OK(g3attn_model_get_info(model.get(), &info));
  REQUIRE(info.layer_index >= 0);
  g.layer = info.layer_index;
  return g;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b, int64_t width,
                const std::vector<bool>& row_ok) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!row_ok.empty() && !row_ok[i / size_t(width)]) continue;
    const double e = std::fabs(double(a[i]) - double(b[i]));
    if (std::isnan(e)) return INFINITY;
    if (e > m) m = e;
  }
  return m;
}

double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float f : a) m = std::max(m, double(std::fabs(f)));
  return m;
}

std::string tiny_config_json(int kv_heads) {
  return "{\"model_type\": \"gemma3_text\", \"hidden_size\": 64, \"num_attention_heads\": " +
         std::to_string(2 * kv_heads) + ", \"num_key_value_heads\": " + std::to_string(kv_heads) +
         ", \"head_dim\": 16, \"query_pre_attn_scalar\": 16, \"sliding_window\": 4,"
         " \"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0,"
         " \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}, \"rms_norm_eps\": 1e-06,"
         " \"num_hidden_layers\": 6, \"max_position_embeddings\": 131072}";
}

}  // namespace g3apitest
