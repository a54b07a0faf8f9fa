// Every entry point of include/g3attn/g3attn.h with good and bad arguments:
// null pointers, sizes that disagree, unknown names, bad files. Each bad
// call must return its status with a thread-local message naming the
// function and the problem, write no output handle, and never crash (the
// sanitizer stage runs this suite). A refused cache call must leave the
// cache exactly as it was.
#include <cstring>
#include <thread>

#include "tests/api/api_test_util.h"
#include "tests/support/test_support.h"

using namespace g3apitest;

namespace {

const char* kTinyLocal = "tiny_local_L0_T12_B2_rightpad";

// Everything a cache row shows, copied, to compare before and after a call.
struct RowSnapshot {
  std::vector<uint8_t> k, v, valid;
  std::vector<int32_t> positions;
  int64_t written = 0, last_position = 0;
  bool operator==(const RowSnapshot& o) const {
    return k == o.k && v == o.v && valid == o.valid && positions == o.positions && written == o.written &&
           last_position == o.last_position;
  }
};

RowSnapshot snapshot(const g3attn_cache* c, int64_t row) {
  g3attn_cache_view w;
  API_OK(g3attn_cache_row(c, row, &w));
  const size_t bytes = size_t(w.num_kv_heads) * size_t(w.slots) * size_t(w.head_dim) * (w.dtype == G3ATTN_F32 ? 4 : 2);
  RowSnapshot s;
  s.k.assign(static_cast<const uint8_t*>(w.k), static_cast<const uint8_t*>(w.k) + bytes);
  s.v.assign(static_cast<const uint8_t*>(w.v), static_cast<const uint8_t*>(w.v) + bytes);
  s.valid.assign(w.valid, w.valid + w.slots);
  s.positions.assign(w.positions, w.positions + w.slots);
  s.written = w.written;
  s.last_position = w.last_position;
  return s;
}

}  // namespace

TEST_CASE("version, ABI, status names and the message") {
  const std::string v = g3attn_version();
  CHECK(v == G3ATTN_VERSION_STRING);
  CHECK(std::count(v.begin(), v.end(), '.') == 2);
  CHECK(g3attn_abi_version() == G3ATTN_ABI_VERSION);
  CHECK(g3attn_abi_version() >= 1);
  CHECK(std::string(g3attn_status_name(G3ATTN_OK)) == "ok");
  CHECK(std::string(g3attn_status_name(G3ATTN_ERROR_NULL)) == "null");
  CHECK(std::string(g3attn_status_name(G3ATTN_ERROR_CACHE)) == "cache");
  CHECK(std::string(g3attn_status_name(G3ATTN_ERROR_INTERNAL)) == "internal");
  CHECK(std::string(g3attn_status_name(static_cast<g3attn_status>(99))) == "unknown");

  // A failure sets the message; the next successful call clears it.
  g3attn_model* m = reinterpret_cast<g3attn_model*>(0x1);
  API_FAILS(g3attn_model_builtin("2b", &m), G3ATTN_ERROR_NAME, "2b");
  CHECK(m == nullptr);  // a failed call writes no handle
  Model ok = builtin("1b");
  CHECK(std::string(g3attn_last_error()).empty());

  // The message is per thread: another thread's failure does not show here.
  API_FAILS(g3attn_model_builtin("nope", &m), G3ATTN_ERROR_NAME, "nope");
  std::string other;
  std::thread t([&] {
    other = g3attn_last_error();
    g3attn_model* mm = nullptr;
    (void)g3attn_model_builtin("other-thread", &mm);
  });
  t.join();
  CHECK(other.empty());
  CHECK(std::string(g3attn_last_error()).find("nope") != std::string::npos);
}

TEST_CASE("models: built-in names, config text, files, per-layer queries") {
  g3attn_model* m = nullptr;
  API_FAILS(g3attn_model_builtin(nullptr, &m), G3ATTN_ERROR_NULL, "name");
  API_FAILS(g3attn_model_builtin("1b", nullptr), G3ATTN_ERROR_NULL, "out");
  API_FAILS(g3attn_model_builtin("", &m), G3ATTN_ERROR_NAME, "");
  API_FAILS(g3attn_model_from_json(nullptr, &m), G3ATTN_ERROR_NULL, "json");
  API_FAILS(g3attn_model_from_json("{", &m), G3ATTN_ERROR_INPUT, "config");
  API_FAILS(g3attn_model_from_json("{\"hidden_size\": -3}", &m), G3ATTN_ERROR_INPUT, "");
  API_FAILS(g3attn_model_from_json("[]", nullptr), G3ATTN_ERROR_NULL, "out");
  API_FAILS(g3attn_model_load(nullptr, &m), G3ATTN_ERROR_NULL, "config_path");
  API_FAILS(g3attn_model_load("/nonexistent/config.json", &m), G3ATTN_ERROR_INPUT, "/nonexistent/config.json");
  g3test::TempDir tmp;
  g3test::write_text(tmp.file("bad.json"), "{\"model_type\": \"gemma3_text\", \"hidden_size\": ");
  API_FAILS(g3attn_model_load(tmp.file("bad.json").c_str(), &m), G3ATTN_ERROR_INPUT, "bad.json");
  CHECK(m == nullptr);
  g3attn_model_free(nullptr);  // freeing nothing is allowed, as free(NULL) is

  // The same model from text and from the file.
  const std::string cfg = g3test::golden_file(kTinyLocal, "config.json");
  Model a = load_model(cfg), b = model_from_json(g3test::read_text(cfg));
  g3attn_model_info ia, ib;
  API_OK(g3attn_model_get_info(a.get(), &ia));
  API_OK(g3attn_model_get_info(b.get(), &ib));
  CHECK(ia.hidden_size == 64);
  CHECK(ia.num_heads == 4);
  CHECK(ia.num_kv_heads == 2);
  CHECK(ia.head_dim == 16);
  CHECK(ia.num_layers == 6);
  CHECK(ia.sliding_window == 4);
  CHECK(ia.layer_index == 0);
  CHECK(ib.hidden_size == ia.hidden_size);
  CHECK(ib.num_layers == ia.num_layers);
  API_FAILS(g3attn_model_get_info(nullptr, &ia), G3ATTN_ERROR_NULL, "model");
  API_FAILS(g3attn_model_get_info(a.get(), nullptr), G3ATTN_ERROR_NULL, "out");

  Model m27 = builtin("27b");
  g3attn_model_info i27;
  API_OK(g3attn_model_get_info(m27.get(), &i27));
  CHECK(i27.layer_index == -1);
  g3attn_layer_info li;
  API_OK(g3attn_model_layer(m27.get(), 5, &li));
  CHECK(li.kind == G3ATTN_GLOBAL);
  CHECK(li.window == 0);
  CHECK(li.index == 5);
  API_OK(g3attn_model_layer(m27.get(), 0, &li));
  CHECK(li.kind == G3ATTN_LOCAL);
  CHECK(li.window == i27.sliding_window);
  CHECK(li.num_heads == i27.num_heads);
  CHECK(li.alpha > 0.f);
  API_FAILS(g3attn_model_layer(m27.get(), -1, &li), G3ATTN_ERROR_ARGUMENT, "layer -1");
  API_FAILS(g3attn_model_layer(m27.get(), i27.num_layers, &li), G3ATTN_ERROR_ARGUMENT, "outside");
  API_FAILS(g3attn_model_layer(m27.get(), 0, nullptr), G3ATTN_ERROR_NULL, "out");
  API_FAILS(g3attn_model_layer(nullptr, 0, &li), G3ATTN_ERROR_NULL, "model");

  char key[G3ATTN_KEY_MAX];
  API_OK(g3attn_model_layer_key(a.get(), 0, G3ATTN_F32, G3ATTN_BF16, G3ATTN_F32, key, sizeof key));
  CHECK(std::string(key).rfind("dh16_g2_local4_", 0) == 0);
  CHECK(std::string(key).find("_kvf32_wbf16") != std::string::npos);
  API_OK(g3attn_model_layer_key(a.get(), 5, G3ATTN_BF16, G3ATTN_F32, G3ATTN_BF16, key, sizeof key));
  CHECK(std::string(key).find("global") != std::string::npos);
  CHECK(std::string(key).find("kvbf16_cbf16_wbf16") != std::string::npos);  // bf16 compute packs bf16 weights
  char small[8] = "keep";
  API_FAILS(g3attn_model_layer_key(a.get(), 0, G3ATTN_F32, G3ATTN_F32, G3ATTN_F32, small, sizeof small),
            G3ATTN_ERROR_ARGUMENT, "G3ATTN_KEY_MAX");
  CHECK(std::string(small) == "keep");
  API_FAILS(g3attn_model_layer_key(a.get(), 0, static_cast<g3attn_dtype>(7), G3ATTN_F32, G3ATTN_F32, key, sizeof key),
            G3ATTN_ERROR_ARGUMENT, "kv_dtype");
  API_FAILS(g3attn_model_layer_key(a.get(), 0, G3ATTN_F32, G3ATTN_F32, G3ATTN_F32, nullptr, 10), G3ATTN_ERROR_NULL,
            "buf");
  API_FAILS(g3attn_model_layer_key(a.get(), 9, G3ATTN_F32, G3ATTN_F32, G3ATTN_F32, key, sizeof key),
            G3ATTN_ERROR_ARGUMENT, "layer 9");
}

TEST_CASE("options and contexts") {
  g3attn_options* o = nullptr;
  API_FAILS(g3attn_options_create(nullptr), G3ATTN_ERROR_NULL, "out");
  API_OK(g3attn_options_create(&o));
  Options opts(o);
  API_FAILS(g3attn_options_set_backend(nullptr, "auto"), G3ATTN_ERROR_NULL, "options");
  API_FAILS(g3attn_options_set_backend(o, nullptr), G3ATTN_ERROR_NULL, "backend");
  API_FAILS(g3attn_options_set_backend(o, "cuda"), G3ATTN_ERROR_NAME, "cuda");
  API_FAILS(g3attn_options_set_isa(o, "avx9"), G3ATTN_ERROR_NAME, "avx9");
  API_FAILS(g3attn_options_set_isa(o, ""), G3ATTN_ERROR_NAME, "empty");
  API_FAILS(g3attn_options_set_isa(o, nullptr), G3ATTN_ERROR_NULL, "isa");
  API_FAILS(g3attn_options_set_isa(nullptr, "best"), G3ATTN_ERROR_NULL, "options");
  API_FAILS(g3attn_options_set_kv_dtype(o, static_cast<g3attn_dtype>(-1)), G3ATTN_ERROR_ARGUMENT, "kv_dtype");
  API_FAILS(g3attn_options_set_kv_dtype(nullptr, G3ATTN_F32), G3ATTN_ERROR_NULL, "options");
  API_FAILS(g3attn_options_set_compute(o, static_cast<g3attn_dtype>(2)), G3ATTN_ERROR_ARGUMENT, "compute");
  API_FAILS(g3attn_options_set_compute(nullptr, G3ATTN_F32), G3ATTN_ERROR_NULL, "options");
  API_FAILS(g3attn_options_set_threads(o, -1), G3ATTN_ERROR_ARGUMENT, "threads = -1");
  API_FAILS(g3attn_options_set_threads(o, 5000), G3ATTN_ERROR_ARGUMENT, "threads = 5000");
  API_FAILS(g3attn_options_set_threads(nullptr, 1), G3ATTN_ERROR_NULL, "options");
  API_FAILS(g3attn_options_set_projections(o, "mkl"), G3ATTN_ERROR_NAME, "mkl");
  API_FAILS(g3attn_options_set_projections(o, "OneDNN"), G3ATTN_ERROR_NAME, "valid: auto, highway, onednn");
  API_FAILS(g3attn_options_set_projections(o, nullptr), G3ATTN_ERROR_NULL, "provider");
  API_FAILS(g3attn_options_set_projections(nullptr, "auto"), G3ATTN_ERROR_NULL, "options");
  for (const char* p : {"auto", "highway", "onednn"}) API_OK(g3attn_options_set_projections(o, p));
  API_OK(g3attn_options_set_projections(o, "auto"));
  g3attn_options_free(nullptr);

  // Refused settings changed nothing: the context has the defaults.
  g3attn_context* c = nullptr;
  API_FAILS(g3attn_context_create(o, nullptr), G3ATTN_ERROR_NULL, "out");
  API_OK(g3attn_context_create(o, &c));
  Context ctx(c);
  g3attn_context_info info;
  API_OK(g3attn_context_get_info(c, &info));
  CHECK(std::string(info.backend) == "auto");
  CHECK(info.kv_dtype == G3ATTN_F32);
  CHECK(info.compute == G3ATTN_F32);
  CHECK(info.threads >= 1);
  CHECK(std::string(info.isa).size() > 0);
  API_FAILS(g3attn_context_get_info(nullptr, &info), G3ATTN_ERROR_NULL, "context");
  API_FAILS(g3attn_context_get_info(c, nullptr), G3ATTN_ERROR_NULL, "out");

  API_OK(g3attn_options_set_backend(o, "highway"));
  API_OK(g3attn_options_set_isa(o, "avx2"));
  API_OK(g3attn_options_set_kv_dtype(o, G3ATTN_BF16));
  API_OK(g3attn_options_set_compute(o, G3ATTN_BF16));
  API_OK(g3attn_options_set_threads(o, 1));
  g3attn_context* c2 = nullptr;
  API_OK(g3attn_context_create(o, &c2));
  Context ctx2(c2);
  opts.reset();  // a context does not need its options afterwards
  API_OK(g3attn_context_get_info(c2, &info));
  CHECK(std::string(info.backend) == "highway");
  CHECK(std::string(info.isa) == "avx2");
  CHECK(info.kv_dtype == G3ATTN_BF16);
  CHECK(info.compute == G3ATTN_BF16);
  CHECK(info.threads == 1);

  g3attn_context* c3 = nullptr;
  API_OK(g3attn_context_create(nullptr, &c3));  // NULL options: the defaults
  g3attn_context_free(c3);
  g3attn_context_free(nullptr);
}

TEST_CASE("weights: checkpoints, random, caller tensors, reading one tensor") {
  Model model = load_model(g3test::golden_file(kTinyLocal, "config.json"));
  const std::string st = g3test::golden_file(kTinyLocal, "weights.safetensors");
  g3attn_weights* w = nullptr;
  API_FAILS(g3attn_weights_open(nullptr, model.get(), &w), G3ATTN_ERROR_NULL, "path");
  API_FAILS(g3attn_weights_open(st.c_str(), model.get(), nullptr), G3ATTN_ERROR_NULL, "out");
  API_FAILS(g3attn_weights_open("/nonexistent.safetensors", model.get(), &w), G3ATTN_ERROR_INPUT,
            "/nonexistent.safetensors");
  g3test::TempDir tmp;
  g3test::write_bytes(tmp.file("junk.safetensors"), {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  API_FAILS(g3attn_weights_open(tmp.file("junk.safetensors").c_str(), model.get(), &w), G3ATTN_ERROR_INPUT,
            "junk.safetensors");
  // A checkpoint for a different model: refused when opened or when a layer is made.
  Model big = builtin("1b");
  {
    g3attn_weights* wb = nullptr;
    const g3attn_status s = g3attn_weights_open(st.c_str(), big.get(), &wb);
    if (s == G3ATTN_OK) {
      Weights hold(wb);
      Context ctx = context();
      g3attn_layer* l = nullptr;
      API_FAILS(g3attn_layer_create(ctx.get(), big.get(), 0, wb, &l), G3ATTN_ERROR_INPUT, "");
      CHECK(l == nullptr);
    } else {
      CHECK(s == G3ATTN_ERROR_INPUT);
      CHECK(wb == nullptr);
    }
  }
  CHECK(w == nullptr);
  Weights ck = open_weights(st, model.get());
  Weights ck2 = open_weights(st, nullptr);  // the model from the config.json beside it

  g3attn_model* from = nullptr;
  API_OK(g3attn_model_from_weights(ck2.get(), &from));
  Model fm(from);
  g3attn_model_info fi;
  API_OK(g3attn_model_get_info(from, &fi));
  CHECK(fi.hidden_size == 64);
  API_FAILS(g3attn_model_from_weights(nullptr, &from), G3ATTN_ERROR_NULL, "weights");
  API_FAILS(g3attn_model_from_weights(ck.get(), nullptr), G3ATTN_ERROR_NULL, "out");
  Weights rnd = random_weights(3);
  API_FAILS(g3attn_model_from_weights(rnd.get(), &from), G3ATTN_ERROR_ARGUMENT, "g3attn_weights_open");

  API_FAILS(g3attn_weights_random(1, static_cast<g3attn_dtype>(3), &w), G3ATTN_ERROR_ARGUMENT, "dtype");
  API_FAILS(g3attn_weights_random(1, G3ATTN_F32, nullptr), G3ATTN_ERROR_NULL, "out");

  // Reading tensors: every one, with the exact count; wrong counts refused.
  const int64_t D = 64, H = 16, N = 4, K = 2;
  const size_t counts[8] = {size_t(N * H * D), size_t(K * H * D), size_t(K * H * D), size_t(D * N * H),
                            size_t(H), size_t(H), size_t(D), size_t(D)};
  std::vector<std::vector<float>> t(8);
  for (int i = 0; i < 8; ++i) {
    t[size_t(i)].assign(counts[i], NAN);
    API_OK(g3attn_weights_read(ck.get(), model.get(), 0, static_cast<g3attn_tensor>(i), t[size_t(i)].data(),
                               counts[i]));
    for (float f : t[size_t(i)]) REQUIRE(std::isfinite(f));
  }
  std::vector<float> dst(counts[0] + 1, 7.f);
  API_FAILS(g3attn_weights_read(ck.get(), model.get(), 0, G3ATTN_Q_PROJ, dst.data(), counts[0] + 1),
            G3ATTN_ERROR_ARGUMENT, "count");
  CHECK(dst[0] == 7.f);
  API_FAILS(g3attn_weights_read(ck.get(), model.get(), 0, static_cast<g3attn_tensor>(8), dst.data(), 10),
            G3ATTN_ERROR_ARGUMENT, "tensor = 8");
  API_FAILS(g3attn_weights_read(ck.get(), model.get(), 6, G3ATTN_Q_NORM, dst.data(), 16), G3ATTN_ERROR_ARGUMENT,
            "layer 6");
  API_FAILS(g3attn_weights_read(nullptr, model.get(), 0, G3ATTN_Q_NORM, dst.data(), 16), G3ATTN_ERROR_NULL,
            "weights");
  API_FAILS(g3attn_weights_read(ck.get(), nullptr, 0, G3ATTN_Q_NORM, dst.data(), 16), G3ATTN_ERROR_NULL, "model");
  API_FAILS(g3attn_weights_read(ck.get(), model.get(), 0, G3ATTN_Q_NORM, nullptr, 16), G3ATTN_ERROR_NULL, "dst");
  std::vector<float> rq(counts[0]);
  API_OK(g3attn_weights_read(rnd.get(), model.get(), 0, G3ATTN_Q_PROJ, rq.data(), rq.size()));
  CHECK(max_abs(rq) > 0);

  // Caller tensors: every pointer is required, dtypes checked.
  g3attn_tensors tens{};
  tens.dtype = G3ATTN_F32;
  tens.q_proj = t[0].data();
  tens.k_proj = t[1].data();
  tens.v_proj = t[2].data();
  tens.o_proj = t[3].data();
  tens.norm_dtype = G3ATTN_F32;
  tens.q_norm = t[4].data();
  tens.k_norm = t[5].data();
  tens.input_norm = t[6].data();
  tens.post_norm = t[7].data();
  API_FAILS(g3attn_weights_from_tensors(nullptr, &w), G3ATTN_ERROR_NULL, "tensors");
  API_FAILS(g3attn_weights_from_tensors(&tens, nullptr), G3ATTN_ERROR_NULL, "out");
  for (int i = 0; i < 8; ++i) {
    g3attn_tensors bad = tens;
    const void** fields[8] = {&bad.q_proj, &bad.k_proj, &bad.v_proj, &bad.o_proj,
                              &bad.q_norm, &bad.k_norm, &bad.input_norm, &bad.post_norm};
    *fields[i] = nullptr;
    API_FAILS(g3attn_weights_from_tensors(&bad, &w), G3ATTN_ERROR_NULL, "tensors.");
  }
  g3attn_tensors bad_dt = tens;
  bad_dt.dtype = static_cast<g3attn_dtype>(5);
  API_FAILS(g3attn_weights_from_tensors(&bad_dt, &w), G3ATTN_ERROR_ARGUMENT, "tensors.dtype");
  bad_dt = tens;
  bad_dt.norm_dtype = static_cast<g3attn_dtype>(5);
  API_FAILS(g3attn_weights_from_tensors(&bad_dt, &w), G3ATTN_ERROR_ARGUMENT, "tensors.norm_dtype");
  CHECK(w == nullptr);

  // Non-finite caller weights are refused when the layer is made.
  std::vector<float> q_nan = t[0];
  q_nan[17] = NAN;
  g3attn_tensors nan_t = tens;
  nan_t.q_proj = q_nan.data();
  API_OK(g3attn_weights_from_tensors(&nan_t, &w));
  Weights wn(w);
  Context ctx = context();
  g3attn_layer* l = nullptr;
  API_FAILS(g3attn_layer_create(ctx.get(), model.get(), 0, wn.get(), &l), G3ATTN_ERROR_INPUT, "q_proj");
  CHECK(l == nullptr);
  g3attn_weights_free(nullptr);
}

TEST_CASE("layers and head ranges: bad arguments, describe") {
  Model model = load_model(g3test::golden_file(kTinyLocal, "config.json"));
  Weights w = random_weights(5);
  Context ctx = context();
  g3attn_layer* l = nullptr;
  API_FAILS(g3attn_layer_create(nullptr, model.get(), 0, w.get(), &l), G3ATTN_ERROR_NULL, "context");
  API_FAILS(g3attn_layer_create(ctx.get(), nullptr, 0, w.get(), &l), G3ATTN_ERROR_NULL, "model");
  API_FAILS(g3attn_layer_create(ctx.get(), model.get(), 0, nullptr, &l), G3ATTN_ERROR_NULL, "weights");
  API_FAILS(g3attn_layer_create(ctx.get(), model.get(), 0, w.get(), nullptr), G3ATTN_ERROR_NULL, "out");
  API_FAILS(g3attn_layer_create(ctx.get(), model.get(), 6, w.get(), &l), G3ATTN_ERROR_ARGUMENT, "layer 6");
  API_FAILS(g3attn_layer_create(ctx.get(), model.get(), -2, w.get(), &l), G3ATTN_ERROR_ARGUMENT, "layer -2");
  for (auto [j0, j1] : {std::pair{0, 0}, std::pair{1, 1}, std::pair{2, 1}, std::pair{-1, 1}, std::pair{0, 3}}) {
    API_FAILS(g3attn_layer_create_heads(ctx.get(), model.get(), 0, w.get(), j0, j1, &l), G3ATTN_ERROR_ARGUMENT, "");
  }
  API_FAILS(g3attn_layer_create_heads(ctx.get(), model.get(), 0, w.get(), 0, 1, nullptr), G3ATTN_ERROR_NULL, "out");
  CHECK(l == nullptr);
  g3attn_layer_free(nullptr);

  Layer whole = make_layer(ctx.get(), model.get(), 5, w.get());
  Layer part = make_heads(ctx.get(), model.get(), 5, w.get(), 1, 2);
  g3attn_layer_route r;
  API_OK(g3attn_layer_describe(whole.get(), &r));
  CHECK(r.index == 5);
  CHECK(r.kind == G3ATTN_GLOBAL);
  CHECK(r.kv_begin == 0);
  CHECK(r.kv_end == 2);
  CHECK(r.num_heads == 4);
  CHECK(r.num_kv_heads == 2);
  CHECK(r.head_dim == 16);
  CHECK(r.hidden_size == 64);
  CHECK(std::string(r.key).find("global") != std::string::npos);
  CHECK(std::string(r.backend).size() > 0);
  CHECK(std::string(r.isa).size() > 0);
  API_OK(g3attn_layer_describe(part.get(), &r));
  CHECK(r.kv_begin == 1);
  CHECK(r.kv_end == 2);
  CHECK(r.num_heads == 2);
  CHECK(r.num_kv_heads == 1);
  API_FAILS(g3attn_layer_describe(nullptr, &r), G3ATTN_ERROR_NULL, "layer");
  API_FAILS(g3attn_layer_describe(whole.get(), nullptr), G3ATTN_ERROR_NULL, "out");

  // Freed in any order: the layer outlives its context and weights handles.
  ctx.reset();
  w.reset();
  model.reset();
  Cache c = make_cache(whole.get(), 1, 8, 8);
  whole.reset();
  std::vector<float> x = randn(4 * 64, 1), y(4 * 64);
  const int32_t pos[4] = {0, 1, 2, 3};
  API_OK(g3attn_block(part.get(), nullptr, x.data(), pos, nullptr, 1, 4, y.data(), nullptr, 0));
  CHECK(std::isfinite(y[0]));
}

TEST_CASE("caches: sizes, caller memory, rows, reset") {
  Model model = load_model(g3test::golden_file(kTinyLocal, "config.json"));
  Weights w = random_weights(5);
  Context ctx = context();
  Layer local = make_layer(ctx.get(), model.get(), 0, w.get());   // W = 4
  Layer global = make_layer(ctx.get(), model.get(), 5, w.get());
  int64_t slots = 0;
  API_OK(g3attn_cache_slots(local.get(), 100, 8, &slots));
  CHECK(slots == 4 + 8 - 1);
  API_OK(g3attn_cache_slots(local.get(), 6, 8, &slots));
  CHECK(slots == 6);
  API_OK(g3attn_cache_slots(global.get(), 100, 8, &slots));
  CHECK(slots == 100);
  API_FAILS(g3attn_cache_slots(nullptr, 10, 1, &slots), G3ATTN_ERROR_NULL, "layer");
  API_FAILS(g3attn_cache_slots(local.get(), 10, 1, nullptr), G3ATTN_ERROR_NULL, "slots");
  API_FAILS(g3attn_cache_slots(local.get(), 0, 1, &slots), G3ATTN_ERROR_ARGUMENT, "context = 0");
  API_FAILS(g3attn_cache_slots(local.get(), 10, 0, &slots), G3ATTN_ERROR_ARGUMENT, "chunk = 0");

  g3attn_cache* c = nullptr;
  API_FAILS(g3attn_cache_create(nullptr, 1, 10, 1, &c), G3ATTN_ERROR_NULL, "layer");
  API_FAILS(g3attn_cache_create(local.get(), 1, 10, 1, nullptr), G3ATTN_ERROR_NULL, "out");
  API_FAILS(g3attn_cache_create(local.get(), 0, 10, 1, &c), G3ATTN_ERROR_ARGUMENT, "batch = 0");
  API_FAILS(g3attn_cache_create(local.get(), 1, -5, 1, &c), G3ATTN_ERROR_ARGUMENT, "context = -5");
  API_FAILS(g3attn_cache_create(local.get(), 1, 10, -1, &c), G3ATTN_ERROR_ARGUMENT, "chunk = -1");
  API_FAILS(g3attn_cache_create(global.get(), 1 << 20, int64_t(1) << 30, 1, &c), G3ATTN_ERROR_MEMORY, "bytes");
  CHECK(c == nullptr);

  // Caller memory: exactly the documented size, aligned, K and V apart.
  API_OK(g3attn_cache_slots(global.get(), 10, 4, &slots));
  const size_t bytes = size_t(2 /*batch*/ * 2 /*Nkv*/ * slots * 16 * 4);
  std::vector<float> k(bytes / 4 + 1), v(bytes / 4);
  API_FAILS(g3attn_cache_wrap(global.get(), 2, 10, 4, k.data(), v.data(), bytes - 4, &c), G3ATTN_ERROR_ARGUMENT,
            "the cache needs");
  API_FAILS(g3attn_cache_wrap(global.get(), 2, 10, 4, nullptr, v.data(), bytes, &c), G3ATTN_ERROR_NULL, "k");
  API_FAILS(g3attn_cache_wrap(global.get(), 2, 10, 4, k.data(), nullptr, bytes, &c), G3ATTN_ERROR_NULL, "v");
  API_FAILS(g3attn_cache_wrap(global.get(), 2, 10, 4, k.data(), k.data(), bytes, &c), G3ATTN_ERROR_ARGUMENT, "overlap");
  API_FAILS(g3attn_cache_wrap(global.get(), 2, 10, 4, reinterpret_cast<char*>(k.data()) + 1, v.data(), bytes, &c),
            G3ATTN_ERROR_ARGUMENT, "aligned");
  API_FAILS(g3attn_cache_wrap(global.get(), 2, 10, 4, k.data(), v.data(), bytes, nullptr), G3ATTN_ERROR_NULL, "out");
  CHECK(c == nullptr);
  API_OK(g3attn_cache_wrap(global.get(), 2, 10, 4, k.data(), v.data(), bytes, &c));
  Cache wrapped(c);
  g3attn_cache_view view;
  API_OK(g3attn_cache_row(c, 1, &view));
  CHECK(view.k == static_cast<const void*>(reinterpret_cast<const char*>(k.data()) + bytes / 2));
  CHECK(view.v == static_cast<const void*>(reinterpret_cast<const char*>(v.data()) + bytes / 2));
  CHECK(view.slots == 10);
  CHECK(view.written == 0);
  CHECK(view.last_position == -1);
  CHECK(view.num_kv_heads == 2);
  CHECK(view.head_dim == 16);
  CHECK(view.dtype == G3ATTN_F32);
  CHECK(view.ring == 0);
  API_FAILS(g3attn_cache_row(c, 2, &view), G3ATTN_ERROR_ARGUMENT, "row 2");
  API_FAILS(g3attn_cache_row(c, -1, &view), G3ATTN_ERROR_ARGUMENT, "row -1");
  API_FAILS(g3attn_cache_row(nullptr, 0, &view), G3ATTN_ERROR_NULL, "cache");
  API_FAILS(g3attn_cache_row(c, 0, nullptr), G3ATTN_ERROR_NULL, "out");
  uint64_t total = 0;
  API_OK(g3attn_cache_bytes(c, &total));
  CHECK(total == 2 * bytes);
  API_FAILS(g3attn_cache_bytes(nullptr, &total), G3ATTN_ERROR_NULL, "cache");
  API_FAILS(g3attn_cache_bytes(c, nullptr), G3ATTN_ERROR_NULL, "bytes");

  // Writes go to the caller's memory; reset empties the rows.
  std::vector<float> x = randn(2 * 3 * 64, 2), y(x.size());
  const int32_t pos[6] = {0, 1, 2, 0, 1, 2};
  API_OK(g3attn_block(global.get(), c, x.data(), pos, nullptr, 2, 3, y.data(), nullptr, 0));
  API_OK(g3attn_cache_row(c, 1, &view));
  CHECK(view.written == 3);
  CHECK(view.last_position == 2);
  CHECK(view.valid[0] != 0);
  CHECK(view.valid[3] == 0);
  CHECK(max_abs(k) > 0);
  API_OK(g3attn_cache_reset(c));
  API_OK(g3attn_cache_row(c, 1, &view));
  CHECK(view.written == 0);
  CHECK(view.last_position == -1);
  API_FAILS(g3attn_cache_reset(nullptr), G3ATTN_ERROR_NULL, "cache");

  Cache ring = make_cache(local.get(), 1, 100, 2);
  API_OK(g3attn_cache_row(ring.get(), 0, &view));
  CHECK(view.ring == 1);
  CHECK(view.slots == 5);
  g3attn_cache_free(nullptr);
}

TEST_CASE("running a layer: bad arguments, and refused cache calls change nothing") {
  Model model = load_model(g3test::golden_file(kTinyLocal, "config.json"));
  Weights w = random_weights(9);
  Context ctx = context();
  Layer L = make_layer(ctx.get(), model.get(), 0, w.get());
  Layer G = make_layer(ctx.get(), model.get(), 5, w.get());
  const int64_t D = 64, B = 2, T = 3;
  Cache cache = make_cache(L.get(), B, 12, 3);
  std::vector<float> x = randn(size_t(B * T * D), 4), y(x.size()), a(x.size());
  std::vector<int32_t> pos = {0, 1, 2, 0, 1, 2};
  // A first call that the refused ones must not disturb.
  API_OK(g3attn_block(L.get(), cache.get(), x.data(), pos.data(), nullptr, B, T, y.data(), a.data(), 0));
  const RowSnapshot s0 = snapshot(cache.get(), 0), s1 = snapshot(cache.get(), 1);
  const auto unchanged = [&] {
    CHECK(snapshot(cache.get(), 0) == s0);
    CHECK(snapshot(cache.get(), 1) == s1);
  };

  g3attn_cache* c = cache.get();
  API_FAILS(g3attn_block(nullptr, c, x.data(), pos.data(), nullptr, B, T, y.data(), nullptr, 0), G3ATTN_ERROR_NULL,
            "layer");
  API_FAILS(g3attn_block(L.get(), c, nullptr, pos.data(), nullptr, B, T, y.data(), nullptr, 0), G3ATTN_ERROR_NULL,
            "x");
  API_FAILS(g3attn_block(L.get(), c, x.data(), nullptr, nullptr, B, T, y.data(), nullptr, 0), G3ATTN_ERROR_NULL,
            "positions");
  API_FAILS(g3attn_block(L.get(), c, x.data(), pos.data(), nullptr, B, T, nullptr, nullptr, 0), G3ATTN_ERROR_NULL,
            "both null");
  API_FAILS(g3attn_block(L.get(), c, x.data(), pos.data(), nullptr, 0, T, y.data(), nullptr, 0),
            G3ATTN_ERROR_ARGUMENT, "batch = 0");
  API_FAILS(g3attn_block(L.get(), c, x.data(), pos.data(), nullptr, B, 0, y.data(), nullptr, 0),
            G3ATTN_ERROR_ARGUMENT, "tokens = 0");
  API_FAILS(g3attn_block(L.get(), c, x.data(), pos.data(), nullptr, B, T, y.data(), nullptr, -1),
            G3ATTN_ERROR_ARGUMENT, "threads = -1");
  API_FAILS(g3attn_block(L.get(), c, x.data(), pos.data(), nullptr, B, T, x.data(), nullptr, 0),
            G3ATTN_ERROR_ARGUMENT, "y overlaps x");
  API_FAILS(g3attn_block(L.get(), c, x.data(), pos.data(), nullptr, B, T, y.data(), y.data() + 5, 0),
            G3ATTN_ERROR_ARGUMENT, "overlaps");
  // Sizes that disagree with the cache: its batch, its layer's shape.
  API_FAILS(g3attn_block(L.get(), c, x.data(), pos.data(), nullptr, 1, T, y.data(), nullptr, 0),
            G3ATTN_ERROR_ARGUMENT, "rows");
  API_FAILS(g3attn_block(G.get(), c, x.data(), pos.data(), nullptr, B, T, y.data(), nullptr, 0),
            G3ATTN_ERROR_ARGUMENT, "does not match");
  unchanged();

  // Refused by the cache: positions that do not increase, a chunk larger
  // than the cache was made for, a row past its context, negative positions.
  std::vector<int32_t> back = {3, 4, 5, 2, 3, 4};  // row 1 goes back before its last position 2
  API_FAILS(g3attn_block(L.get(), c, x.data(), back.data(), nullptr, B, T, y.data(), nullptr, 0), G3ATTN_ERROR_CACHE,
            "");
  unchanged();
  std::vector<int32_t> same = {3, 3, 4, 3, 4, 5};
  API_FAILS(g3attn_block(L.get(), c, x.data(), same.data(), nullptr, B, T, y.data(), nullptr, 0), G3ATTN_ERROR_CACHE,
            "");
  unchanged();
  std::vector<float> x4 = randn(size_t(B * 4 * D), 5), y4(x4.size());
  std::vector<int32_t> p4 = {3, 4, 5, 6, 3, 4, 5, 6};
  API_FAILS(g3attn_block(L.get(), c, x4.data(), p4.data(), nullptr, B, 4, y4.data(), nullptr, 0), G3ATTN_ERROR_CACHE,
            "");
  unchanged();
  // With row 0 padded to 3 real tokens the same call is accepted by row 0's
  // check, but row 1 still brings 4: the whole call is refused.
  std::vector<uint8_t> real4 = {1, 1, 1, 0, 1, 1, 1, 1};
  API_FAILS(g3attn_block(L.get(), c, x4.data(), p4.data(), real4.data(), B, 4, y4.data(), nullptr, 0),
            G3ATTN_ERROR_CACHE, "");
  unchanged();
  {
    // A row holds at most `context` real tokens (positions may jump: gaps
    // are allowed); a call past that, or with a negative position, is refused.
    Cache small = make_cache(G.get(), 1, 4, 3);
    std::vector<int32_t> p = {0, 1, 2};
    API_OK(g3attn_block(G.get(), small.get(), x.data(), p.data(), nullptr, 1, 3, y.data(), nullptr, 0));
    const RowSnapshot before = snapshot(small.get(), 0);
    std::vector<int32_t> p2 = {3, 4};
    API_FAILS(g3attn_block(G.get(), small.get(), x.data(), p2.data(), nullptr, 1, 2, y.data(), nullptr, 0),
              G3ATTN_ERROR_CACHE, "");
    CHECK(snapshot(small.get(), 0) == before);
    std::vector<int32_t> p3 = {-1};
    API_FAILS(g3attn_decode(G.get(), small.get(), x.data(), p3.data(), 1, y.data(), 0), G3ATTN_ERROR_CACHE, "");
    CHECK(snapshot(small.get(), 0) == before);
    API_OK(g3attn_decode(G.get(), small.get(), x.data(), p2.data(), 1, y.data(), 0));
    CHECK(snapshot(small.get(), 0).written == 4);
  }
  std::vector<int32_t> far = {3, 4, 5, 100, 101, 102};
  API_OK(g3attn_block(L.get(), c, x.data(), far.data(), nullptr, B, T, y.data(), nullptr, 0));

  // Decode: one token per row, the cache required.
  std::vector<int32_t> dpos = {200, 300};
  API_FAILS(g3attn_decode(L.get(), nullptr, x.data(), dpos.data(), B, y.data(), 0), G3ATTN_ERROR_NULL, "cache");
  API_FAILS(g3attn_decode(nullptr, c, x.data(), dpos.data(), B, y.data(), 0), G3ATTN_ERROR_NULL, "layer");
  API_FAILS(g3attn_decode(L.get(), c, nullptr, dpos.data(), B, y.data(), 0), G3ATTN_ERROR_NULL, "x");
  API_FAILS(g3attn_decode(L.get(), c, x.data(), nullptr, B, y.data(), 0), G3ATTN_ERROR_NULL, "positions");
  API_FAILS(g3attn_decode(L.get(), c, x.data(), dpos.data(), B, nullptr, 0), G3ATTN_ERROR_NULL, "y");
  API_FAILS(g3attn_decode(L.get(), c, x.data(), dpos.data(), 3, y.data(), 0), G3ATTN_ERROR_ARGUMENT, "rows");
  API_FAILS(g3attn_decode(L.get(), c, x.data(), dpos.data(), B, y.data(), 2000), G3ATTN_ERROR_ARGUMENT, "threads");
  API_OK(g3attn_decode(L.get(), c, x.data(), dpos.data(), B, y.data(), 1));

  // The attention part alone and the finish.
  API_FAILS(g3attn_attention(L.get(), nullptr, x.data(), pos.data(), nullptr, B, T, nullptr, 0), G3ATTN_ERROR_NULL,
            "attn");
  API_FAILS(g3attn_attention(nullptr, nullptr, x.data(), pos.data(), nullptr, B, T, a.data(), 0), G3ATTN_ERROR_NULL,
            "layer");
  API_FAILS(g3attn_attention(L.get(), nullptr, nullptr, pos.data(), nullptr, B, T, a.data(), 0), G3ATTN_ERROR_NULL,
            "x");
  API_FAILS(g3attn_attention(L.get(), nullptr, x.data(), nullptr, nullptr, B, T, a.data(), 0), G3ATTN_ERROR_NULL,
            "positions");
  API_FAILS(g3attn_attention(L.get(), nullptr, x.data(), pos.data(), nullptr, B, -4, a.data(), 0),
            G3ATTN_ERROR_ARGUMENT, "tokens = -4");
  std::vector<int32_t> neg = {0, -1, 2, 0, 1, 2};
  API_FAILS(g3attn_attention(L.get(), nullptr, x.data(), neg.data(), nullptr, B, T, a.data(), 0),
            G3ATTN_ERROR_ARGUMENT, "negative");
  // A negative position on a padding token is don't-care.
  std::vector<uint8_t> real = {1, 0, 1, 1, 1, 1};
  API_OK(g3attn_attention(L.get(), nullptr, x.data(), neg.data(), real.data(), B, T, a.data(), 0));

  API_FAILS(g3attn_finish(nullptr, x.data(), a.data(), B * T, y.data(), 0), G3ATTN_ERROR_NULL, "layer");
  API_FAILS(g3attn_finish(L.get(), nullptr, a.data(), B * T, y.data(), 0), G3ATTN_ERROR_NULL, "x");
  API_FAILS(g3attn_finish(L.get(), x.data(), nullptr, B * T, y.data(), 0), G3ATTN_ERROR_NULL, "attn");
  API_FAILS(g3attn_finish(L.get(), x.data(), a.data(), B * T, nullptr, 0), G3ATTN_ERROR_NULL, "y");
  API_FAILS(g3attn_finish(L.get(), x.data(), a.data(), 0, y.data(), 0), G3ATTN_ERROR_ARGUMENT, "tokens = 0");
  API_FAILS(g3attn_finish(L.get(), x.data(), a.data(), B * T, y.data(), -3), G3ATTN_ERROR_ARGUMENT, "threads");
  API_FAILS(g3attn_finish(L.get(), x.data(), a.data(), B * T, a.data() + 1, 0), G3ATTN_ERROR_ARGUMENT, "overlap");
  // y may be exactly attn (in place).
  std::vector<float> y_sep(x.size()), in_place = a;
  API_OK(g3attn_finish(L.get(), x.data(), a.data(), B * T, y_sep.data(), 0));
  API_OK(g3attn_finish(L.get(), x.data(), in_place.data(), B * T, in_place.data(), 0));
  CHECK(max_diff(y_sep, in_place) == 0);
}

TEST_CASE("kernels by key: bad keys, backends and ISAs") {
  g3attn_kernels k;
  API_FAILS(g3attn_kernels_for_key(nullptr, nullptr, nullptr, &k), G3ATTN_ERROR_NULL, "key");
  API_FAILS(g3attn_kernels_for_key("dh16_g2_local4_b10000_s1_a0.25_kvf32_wbf16", nullptr, nullptr, nullptr),
            G3ATTN_ERROR_NULL, "out");
  for (const char* bad : {"", "dh16", "dh15_g2_local4_b10000_s1_a0.25_kvf32_wbf16",
                          "dh16_g0_local4_b10000_s1_a0.25_kvf32_wbf16", "dh16_g2_loco4_b10000_s1_a0.25_kvf32_wbf16",
                          "dh16_g2_local4_b-1_s1_a0.25_kvf32_wbf16", "dh16_g2_local4_b10000_s0.5_a0.25_kvf32_wbf16",
                          "dh16_g2_local4_b10000_s1_anan_kvf32_wbf16", "dh16_g2_local4_b10000_s1_a0.25_kvf16_wbf16",
                          "dh16_g2_local4_b10000_s1_a0.25_kvf32_cf32_wbf16",
                          "dh16_g2_local4_b10000_s1_a0.25_kvf32_wint8", "dh16_g2_global_b1e6_s8_a0.25_kvf32_wf32_x"}) {
    API_FAILS(g3attn_kernels_for_key(bad, nullptr, nullptr, &k), G3ATTN_ERROR_NAME, "kernel key");
  }
  const char* key = "dh16_g2_local4_b10000_s1_a0.25_kvf32_wbf16";
  API_FAILS(g3attn_kernels_for_key(key, "opencl", nullptr, &k), G3ATTN_ERROR_NAME, "opencl");
  API_FAILS(g3attn_kernels_for_key(key, nullptr, "avx99", &k), G3ATTN_ERROR_NAME, "avx99");
  API_OK(g3attn_kernels_for_key(key, "highway", "avx2", &k));
  CHECK(k.table.qk != nullptr);
  CHECK(k.table.core != nullptr);
  CHECK(k.table.gemm != nullptr);
  CHECK(k.table.rmsnorm != nullptr);
  CHECK(std::string(k.backend) == "highway");
  CHECK(std::string(k.isa) == "avx2");
  CHECK(std::string(k.fallback).empty());
}
