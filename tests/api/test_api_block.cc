// What the C API computes: its block equals the golden outputs and the
// runtime's own path (run_apply, which `g3attn apply` used before it went
// through the API); head ranges that cover every KV head sum to the whole
// layer; decode after chunked prefill equals a one-shot prefill; results do
// not depend on the thread count or on who owns the cache memory; a kernel
// table looked up by key computes what the layer computes.
#include <cstdio>
#include <cstring>
#include <thread>

#include "runtime/exec/apply.h"
#include "tests/api/api_test_util.h"
#include "tests/support/test_support.h"

using namespace g3apitest;

namespace {

const char* kTiny[] = {"tiny_local_L0_T12_B2_rightpad", "tiny_global_L5_T12_B2_rightpad",
                       "tiny_local_L2_T16_B2_leftpad"};

// Golden tolerances (tests/golden/README.md), valid rows only.
void check_golden(const Golden& g, const std::vector<float>& attn, const std::vector<float>& y, const char* what) {
  int64_t bad_a = 0, bad_y = 0;
  const double da = g3test::max_abs_diff(attn.data(), g.attn_out.data(), g.B * g.T, g.D, g.real_row, 1e-4, 1e-4, &bad_a);
  const double dy =
      g3test::max_abs_diff(y.data(), g.block_out.data(), g.B * g.T, g.D, g.real_row, 5e-4, 1e-4, &bad_y);
  std::printf("api golden %s %s: attn max |diff| %.3g, block max |diff| %.3g\n", g.dir.c_str(), what, da, dy);
  CHECK(bad_a == 0);
  CHECK(bad_y == 0);
}

}  // namespace

TEST_CASE("the API's block equals the golden outputs and the runtime's path") {
  for (const char* name : kTiny) {
    const Golden g = read_golden(name);
    Model model = load_model(g3test::golden_file(name, "config.json"));
    Weights w = open_weights(g3test::golden_file(name, "weights.safetensors"), model.get());
    for (const char* backend : {"auto", "highway", "reference"}) {
      INFO(name << " backend " << backend);
      Context ctx = context(backend);
      Layer L = make_layer(ctx.get(), model.get(), g.layer, w.get());
      std::vector<float> y(g.x.size()), a(g.x.size());
      API_OK(g3attn_block(L.get(), nullptr, g.x.data(), g.positions.data(), g.real.data(), g.B, g.T, y.data(),
                          a.data(), 0));
      check_golden(g, a, y, backend);
      // The attention part alone and finish give the same numbers.
      std::vector<float> a2(g.x.size()), y2(g.x.size());
      API_OK(g3attn_attention(L.get(), nullptr, g.x.data(), g.positions.data(), g.real.data(), g.B, g.T, a2.data(), 0));
      API_OK(g3attn_finish(L.get(), g.x.data(), a2.data(), g.B * g.T, y2.data(), 0));
      CHECK(max_diff(a, a2, g.D, g.real_row) == 0);
      CHECK(max_diff(y, y2, g.D, g.real_row) <= 1e-6);

      // The runtime's own path on the same files: the same prepared layer
      // and block driver, so the same numbers.
      g3::ApplyRequest r = g3test::golden_apply_request(name);
      r.backend = backend;
      const g3::ApplyResult res = g3::run_apply(r);
      const double dy = max_diff(y, res.block_out, g.D, g.real_row), da = max_diff(a, res.attn_out, g.D, g.real_row);
      std::printf("api vs runtime %s %s: attn %.3g, block %.3g\n", name, backend, da, dy);
      CHECK(da <= 1e-6);
      CHECK(dy <= 1e-6);
      if (std::string(backend) != "reference") {
        // The same kernels were chosen (the reference backend's calls
        // without a cache run the official block instead, on both paths).
        g3attn_layer_route route;
        API_OK(g3attn_layer_describe(L.get(), &route));
        CHECK(res.backend == route.backend);
        CHECK(res.isa == route.isa);
      }
    }

    // Through a library-owned cache, the whole prompt in one call (and
    // again in chunks of 5): the same golden outputs, since padding never
    // enters the cache and the positions of real tokens increase.
    Context ctx = context();
    Layer L = make_layer(ctx.get(), model.get(), g.layer, w.get());
    for (int64_t chunk : {g.T, int64_t{5}}) {
      Cache c = make_cache(L.get(), g.B, g.T, chunk);
      std::vector<float> y(g.x.size()), a(g.x.size());
      // Chunks cut every row at the same token index; a row's chunk holds at
      // most `chunk` real tokens, as the cache was made for.
      for (int64_t t0 = 0; t0 < g.T; t0 += chunk) {
        const int64_t n = std::min(chunk, g.T - t0);
        std::vector<float> xs(size_t(g.B * n * g.D)), ys(xs.size()), as(xs.size());
        std::vector<int32_t> ps(size_t(g.B * n));
        std::vector<uint8_t> rs(size_t(g.B * n));
        for (int64_t b = 0; b < g.B; ++b) {
          std::memcpy(&xs[size_t(b * n * g.D)], &g.x[size_t((b * g.T + t0) * g.D)], sizeof(float) * size_t(n * g.D));
          for (int64_t t = 0; t < n; ++t) {
            ps[size_t(b * n + t)] = g.positions[size_t(b * g.T + t0 + t)];
            rs[size_t(b * n + t)] = g.real[size_t(b * g.T + t0 + t)];
          }
        }
        API_OK(g3attn_block(L.get(), c.get(), xs.data(), ps.data(), rs.data(), g.B, n, ys.data(), as.data(), 0));
        for (int64_t b = 0; b < g.B; ++b) {
          std::memcpy(&y[size_t((b * g.T + t0) * g.D)], &ys[size_t(b * n * g.D)], sizeof(float) * size_t(n * g.D));
          std::memcpy(&a[size_t((b * g.T + t0) * g.D)], &as[size_t(b * n * g.D)], sizeof(float) * size_t(n * g.D));
        }
      }
      check_golden(g, a, y, chunk == g.T ? "cached, one call" : "cached, chunks of 5");
      g3attn_cache_view view;
      for (int64_t b = 0; b < g.B; ++b) {
        API_OK(g3attn_cache_row(c.get(), b, &view));
        int64_t real = 0;
        for (int64_t t = 0; t < g.T; ++t) real += g.real[size_t(b * g.T + t)];
        CHECK(view.written == real);
      }
    }

    // The same weights handed over as caller arrays (f32, read back through
    // the API): the same outputs within the golden bound.
    const int64_t D = g.D, NH = 4 * 16, KH = 2 * 16;
    std::vector<float> t[8] = {std::vector<float>(size_t(NH * D)), std::vector<float>(size_t(KH * D)),
                               std::vector<float>(size_t(KH * D)), std::vector<float>(size_t(D * NH)),
                               std::vector<float>(16), std::vector<float>(16),
                               std::vector<float>(size_t(D)), std::vector<float>(size_t(D))};
    for (int i = 0; i < 8; ++i)
      API_OK(g3attn_weights_read(w.get(), model.get(), g.layer, static_cast<g3attn_tensor>(i), t[i].data(),
                                 t[i].size()));
    g3attn_tensors tens{G3ATTN_F32, t[0].data(), t[1].data(), t[2].data(), t[3].data(),
                        G3ATTN_F32, t[4].data(), t[5].data(), t[6].data(), t[7].data()};
    g3attn_weights* tw = nullptr;
    API_OK(g3attn_weights_from_tensors(&tens, &tw));
    Weights caller(tw);
    Layer LT = make_layer(ctx.get(), model.get(), g.layer, caller.get());
    caller.reset();
    for (auto& v : t) std::fill(v.begin(), v.end(), NAN);  // the layer keeps its own copy
    std::vector<float> y(g.x.size()), a(g.x.size());
    API_OK(g3attn_block(LT.get(), nullptr, g.x.data(), g.positions.data(), g.real.data(), g.B, g.T, y.data(),
                        a.data(), 0));
    check_golden(g, a, y, "caller tensors");
  }
}

namespace {

// A layer's attention output computed whole and as the sum of the shares
// of `ranges` (head ranges of the same layer), for two rows: with caches, a
// prompt of `prompt` tokens then `decode` single-token calls; without, one
// call over every token. Returns max |whole - sum| (and max |whole| through
// max_attn), and checks finish() on the sum against the whole block.
double range_sum_diff(g3attn_context* ctx, const g3attn_model* m, const g3attn_weights* w, int layer,
                      const std::vector<std::pair<int, int>>& ranges, int64_t prompt, int64_t decode, bool cached,
                      double* max_attn) {
  g3attn_layer_info li;
  API_OK(g3attn_model_layer(m, layer, &li));
  const int64_t D = li.hidden_size, B = 2, total = prompt + decode;
  Layer whole = make_layer(ctx, m, layer, w);
  std::vector<Layer> parts;
  std::vector<Cache> caches;
  for (auto [j0, j1] : ranges) parts.push_back(make_heads(ctx, m, layer, w, j0, j1));
  Cache whole_cache = cached ? make_cache(whole.get(), B, total, prompt) : Cache();
  for (auto& p : parts) caches.push_back(cached ? make_cache(p.get(), B, total, prompt) : Cache());
  const std::vector<float> x = randn(size_t(B * total * D), uint64_t(layer) + 11);
  double worst = 0;
  *max_attn = 0;
  std::vector<std::pair<int64_t, int64_t>> calls;
  if (cached) {
    calls.push_back({0, prompt});
    for (int64_t t = prompt; t < total; ++t) calls.push_back({t, 1});
  } else {
    calls.push_back({0, total});
  }
  for (auto [t0, n] : calls) {
    std::vector<float> xs(size_t(B * n * D));
    std::vector<int32_t> ps(size_t(B * n));
    for (int64_t b = 0; b < B; ++b) {
      std::memcpy(&xs[size_t(b * n * D)], &x[size_t((b * total + t0) * D)], sizeof(float) * size_t(n * D));
      for (int64_t t = 0; t < n; ++t) ps[size_t(b * n + t)] = int32_t(3 * b + t0 + t);  // rows at other positions
    }
    std::vector<float> y_whole(xs.size()), a_whole(xs.size()), sum(xs.size(), 0.f), share(xs.size()),
        y_split(xs.size());
    API_OK(g3attn_block(whole.get(), whole_cache.get(), xs.data(), ps.data(), nullptr, B, n, y_whole.data(),
                        a_whole.data(), 0));
    for (size_t i = 0; i < parts.size(); ++i) {
      API_OK(g3attn_attention(parts[i].get(), caches[i].get(), xs.data(), ps.data(), nullptr, B, n, share.data(), 0));
      for (size_t e = 0; e < sum.size(); ++e) sum[e] += share[e];
    }
    worst = std::max(worst, max_diff(a_whole, sum));
    *max_attn = std::max(*max_attn, max_abs(a_whole));
    API_OK(g3attn_finish(parts.back().get(), xs.data(), sum.data(), B * n, y_split.data(), 0));
    CHECK(max_diff(y_whole, y_split) <= 1e-4);
  }
  return worst;
}

}  // namespace

TEST_CASE("head ranges covering every KV head sum to the whole layer's attention output") {
  // Bound: the shares differ from the whole only in how o_proj's reduction
  // over query heads is grouped (f32 sums in another order), so the sum
  // agrees to a few f32 roundings of the output's size: 1e-5 x max |attn|.
  const std::vector<std::pair<const char*, std::vector<std::pair<int, int>>>> splits = {
      {"4 KV heads as 1+2+1", {{0, 1}, {1, 3}, {3, 4}}},
      {"4 KV heads one by one", {{0, 1}, {1, 2}, {2, 3}, {3, 4}}},
      {"4 KV heads as one range", {{0, 4}}}};
  Model model = model_from_json(tiny_config_json(4));
  for (g3attn_dtype wd : {G3ATTN_BF16, G3ATTN_F32}) {
    Weights w = random_weights(21, wd);
    Context ctx = context();
    for (int layer : {0, 5}) {
      for (const auto& [what, ranges] : splits) {
        for (bool cached : {false, true}) {
          double max_attn = 0;
          const double d = range_sum_diff(ctx.get(), model.get(), w.get(), layer, ranges, 9, 4, cached, &max_attn);
          std::printf(
              "head ranges, layer %d, %s, weights %s, %s: max |whole - sum| = %.3g (max |attn| %.3g, bound %.3g)\n",
              layer, what, wd == G3ATTN_BF16 ? "bf16" : "f32", cached ? "prefill 9 + decode 4" : "no cache", d,
              max_attn, 1e-5 * max_attn);
          INFO(what << " layer " << layer << (cached ? " cached" : " no cache"));
          CHECK(max_attn > 0);
          CHECK(d <= 1e-5 * max_attn);
        }
      }
    }
  }
  // A checkpoint's head ranges read only their rows: the golden tiny layer
  // (2 KV heads) split in two.
  const char* name = kTiny[0];
  Model gm = load_model(g3test::golden_file(name, "config.json"));
  Weights gw = open_weights(g3test::golden_file(name, "weights.safetensors"), gm.get());
  Context ctx = context();
  double max_attn = 0;
  const double d = range_sum_diff(ctx.get(), gm.get(), gw.get(), 0, {{0, 1}, {1, 2}}, 6, 3, true, &max_attn);
  std::printf("head ranges, golden %s from its checkpoint: max |whole - sum| = %.3g (max |attn| %.3g)\n", name, d,
              max_attn);
  CHECK(max_attn > 0);
  CHECK(d <= 1e-5 * max_attn);
}

TEST_CASE("decode after chunked prefill equals a one-shot prefill") {
  // Bound: the same arithmetic per query over another tiling of the keys
  // (the online softmax merges them in another order), so a few f32
  // roundings: 2e-5 absolute on outputs of size about 1-4 (x is N(0, 1)).
  Model model = model_from_json(tiny_config_json(2));
  for (g3attn_dtype kv : {G3ATTN_F32, G3ATTN_BF16}) {
    Context ctx = context("auto", kv);
    Weights w = random_weights(31);
    for (int layer : {0, 5}) {
      Layer L = make_layer(ctx.get(), model.get(), layer, w.get());
      const int64_t B = 2, D = 64, total = 21, prompt = 14, chunk = 3;
      const std::vector<float> x = randn(size_t(B * total * D), 77);
      std::vector<int32_t> pos(size_t(B * total));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < total; ++t) pos[size_t(b * total + t)] = int32_t(t + 5 * b);
      // One shot, through a cache made for the whole length.
      Cache one = make_cache(L.get(), B, total, total);
      std::vector<float> y_one(x.size());
      API_OK(g3attn_block(L.get(), one.get(), x.data(), pos.data(), nullptr, B, total, y_one.data(), nullptr, 0));
      // Without a cache (keys = the call's tokens): the same.
      std::vector<float> y_nc(x.size());
      API_OK(g3attn_block(L.get(), nullptr, x.data(), pos.data(), nullptr, B, total, y_nc.data(), nullptr, 0));
      // Chunks of 3 for the prompt, then one decode call per token.
      Cache c = make_cache(L.get(), B, total, chunk);
      std::vector<float> y(x.size());
      std::vector<float> xs, ys;
      std::vector<int32_t> ps;
      auto slice = [&](int64_t t0, int64_t n) {
        xs.assign(size_t(B * n * D), 0.f);
        ys.assign(xs.size(), 0.f);
        ps.assign(size_t(B * n), 0);
        for (int64_t b = 0; b < B; ++b) {
          std::memcpy(&xs[size_t(b * n * D)], &x[size_t((b * total + t0) * D)], sizeof(float) * size_t(n * D));
          for (int64_t t = 0; t < n; ++t) ps[size_t(b * n + t)] = pos[size_t(b * total + t0 + t)];
        }
      };
      auto unslice = [&](int64_t t0, int64_t n) {
        for (int64_t b = 0; b < B; ++b)
          std::memcpy(&y[size_t((b * total + t0) * D)], &ys[size_t(b * n * D)], sizeof(float) * size_t(n * D));
      };
      for (int64_t t0 = 0; t0 < prompt; t0 += chunk) {
        const int64_t n = std::min(chunk, prompt - t0);
        slice(t0, n);
        API_OK(g3attn_block(L.get(), c.get(), xs.data(), ps.data(), nullptr, B, n, ys.data(), nullptr, 0));
        unslice(t0, n);
      }
      for (int64_t t = prompt; t < total; ++t) {
        slice(t, 1);
        API_OK(g3attn_decode(L.get(), c.get(), xs.data(), ps.data(), B, ys.data(), 0));
        unslice(t, 1);
      }
      const double d = max_diff(y, y_one), dn = max_diff(y_nc, y_one);
      std::printf("chunked prefill + decode vs one shot, layer %d, kv %s: max |diff| %.3g (no cache vs one shot %.3g)\n",
                  layer, kv == G3ATTN_F32 ? "f32" : "bf16", d, dn);
      CHECK(d <= 2e-5);
      CHECK(dn <= 2e-5);
      g3attn_cache_view view;
      API_OK(g3attn_cache_row(c.get(), 1, &view));
      CHECK(view.written == total);
      CHECK(view.last_position == total - 1 + 5);
      CHECK(view.ring == (layer == 0 ? 1 : 0));
    }
  }
}

TEST_CASE("results do not depend on threads, callers, or who owns the cache") {
  Model model = model_from_json(tiny_config_json(2));
  Weights w = random_weights(41);
  Context ctx = context("auto", G3ATTN_F32, G3ATTN_F32, 2);
  Layer L = make_layer(ctx.get(), model.get(), 5, w.get());
  const int64_t B = 3, T = 40, D = 64;
  const std::vector<float> x = randn(size_t(B * T * D), 8);
  std::vector<int32_t> pos(size_t(B * T));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i % size_t(T));
  auto run = [&](g3attn_cache* c, int threads) {
    std::vector<float> y(x.size());
    API_OK(g3attn_block(L.get(), c, x.data(), pos.data(), nullptr, B, T, y.data(), nullptr, threads));
    return y;
  };
  Cache c0 = make_cache(L.get(), B, T, T), c1 = make_cache(L.get(), B, T, T), c3 = make_cache(L.get(), B, T, T);
  const std::vector<float> y0 = run(c0.get(), 0), y1 = run(c1.get(), 1), y3 = run(c3.get(), 3);
  CHECK(max_diff(y0, y1) == 0);
  CHECK(max_diff(y0, y3) == 0);

  // Caller memory instead of the library's: bit-identical, and the K the
  // library shows for a row is the caller's bytes.
  int64_t slots = 0;
  API_OK(g3attn_cache_slots(L.get(), T, T, &slots));
  const size_t bytes = size_t(B * 2 * slots * 16 * 4);
  std::vector<float> k(bytes / 4), v(bytes / 4);
  g3attn_cache* wc = nullptr;
  API_OK(g3attn_cache_wrap(L.get(), B, T, T, k.data(), v.data(), bytes, &wc));
  Cache wrapped(wc);
  CHECK(max_diff(run(wc, 0), y0) == 0);
  g3attn_cache_view view;
  API_OK(g3attn_cache_row(c0.get(), 2, &view));
  CHECK(std::memcmp(view.k, reinterpret_cast<const char*>(k.data()) + 2 * bytes / 3, bytes / 3) == 0);

  // Two threads on the same layer, each with its own cache: as if alone.
  std::vector<float> ya(x.size()), yb(x.size());
  Cache ca = make_cache(L.get(), B, T, T), cb = make_cache(L.get(), B, T, T);
  std::string err_a, err_b;
  std::thread ta([&] {
    if (g3attn_block(L.get(), ca.get(), x.data(), pos.data(), nullptr, B, T, ya.data(), nullptr, 1) != G3ATTN_OK)
      err_a = g3attn_last_error();
  });
  std::thread tb([&] {
    if (g3attn_block(L.get(), cb.get(), x.data(), pos.data(), nullptr, B, T, yb.data(), nullptr, 0) != G3ATTN_OK)
      err_b = g3attn_last_error();
  });
  ta.join();
  tb.join();
  CHECK(err_a.empty());
  CHECK(err_b.empty());
  CHECK(max_diff(ya, y0) == 0);
  CHECK(max_diff(yb, y0) == 0);
}

TEST_CASE("kernel lookup by key returns a usable g3_kernel_table") {
  const char* name = kTiny[1];
  Model model = load_model(g3test::golden_file(name, "config.json"));
  Weights w = open_weights(g3test::golden_file(name, "weights.safetensors"), model.get());
  Context ctx = context();
  Layer L = make_layer(ctx.get(), model.get(), 5, w.get());
  g3attn_layer_route route;
  API_OK(g3attn_layer_describe(L.get(), &route));
  g3attn_kernels k;
  API_OK(g3attn_kernels_for_key(route.key, nullptr, nullptr, &k));
  REQUIRE(k.table.rmsnorm != nullptr);
  REQUIRE(k.table.gemm != nullptr);
  REQUIRE(k.table.qk != nullptr);
  REQUIRE(k.table.core != nullptr);
  CHECK(std::string(k.isa) == route.isa);

  // The post-norm with the residual through the table equals g3attn_finish.
  const int64_t D = 64, R = 5;
  const std::vector<float> x = randn(size_t(R * D), 1), attn = randn(size_t(R * D), 2);
  std::vector<float> post(static_cast<size_t>(D)), y_table(static_cast<size_t>(R * D)), y_api(y_table.size());
  API_OK(g3attn_weights_read(w.get(), model.get(), 5, G3ATTN_POST_NORM, post.data(), post.size()));
  g3attn_layer_info li;
  API_OK(g3attn_model_layer(model.get(), 5, &li));
  k.table.rmsnorm(attn.data(), R, D, D, post.data(), li.rms_eps, x.data(), y_table.data(), D);
  API_OK(g3attn_finish(L.get(), x.data(), attn.data(), R, y_api.data(), 1));
  const double dn = max_diff(y_table, y_api);
  std::printf("kernels by key: rmsnorm vs g3attn_finish max |diff| %.3g\n", dn);
  CHECK(dn <= 1e-6);

  // The GEMM of an f32-weight key on o_proj packed as the contract says,
  // against a double-precision product.
  char key[G3ATTN_KEY_MAX];
  API_OK(g3attn_model_layer_key(model.get(), 5, G3ATTN_F32, G3ATTN_F32, G3ATTN_F32, key, sizeof key));
  g3attn_kernels kf;
  API_OK(g3attn_kernels_for_key(key, "auto", nullptr, &kf));
  REQUIRE(kf.table.gemm != nullptr);
  const int64_t K = 4 * 16, N = D;
  std::vector<float> wo(size_t(N * K));
  API_OK(g3attn_weights_read(w.get(), model.get(), 5, G3ATTN_O_PROJ, wo.data(), wo.size()));
  const int64_t panels = (N + G3_PANEL - 1) / G3_PANEL;
  std::vector<float> packed(size_t(panels * K * G3_PANEL), 0.f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t kk = 0; kk < K; ++kk)
      packed[size_t(((n / G3_PANEL) * K + kk) * G3_PANEL + n % G3_PANEL)] = wo[size_t(n * K + kk)];
  const std::vector<float> a = randn(size_t(R * K), 3);
  std::vector<float> c(size_t(R * N), NAN), want(size_t(R * N));
  g3_gemm_args ga{};
  ga.M = R;
  ga.K = K;
  ga.N = N;
  ga.a = a.data();
  ga.lda = K;
  ga.w = packed.data();
  ga.w_dtype = G3_DTYPE_F32;
  ga.n_begin = 0;
  ga.n_end = N;
  ga.c = c.data();
  ga.ldc = N;
  ga.compute = G3_COMPUTE_F32;
  kf.table.gemm(&ga);
  for (int64_t m = 0; m < R; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t kk = 0; kk < K; ++kk) s += double(a[size_t(m * K + kk)]) * double(wo[size_t(n * K + kk)]);
      want[size_t(m * N + n)] = float(s);
    }
  const double dg = max_diff(c, want);
  std::printf("kernels by key: gemm vs double max |diff| %.3g (max |c| %.3g)\n", dg, max_abs(want));
  CHECK(dg <= 1e-5 * std::max(1.0, max_abs(want)));
}
