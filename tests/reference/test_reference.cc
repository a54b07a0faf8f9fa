// The scalar reference itself: SPEC 1.4's sliding-mask examples, the
// official cache (prefill then decode equals one-shot prefill), fully masked
// rows, and the contract-level kernels against the official block.
#include <catch2/catch.hpp>
#include <cmath>

#include "runtime/exec/block.h"
#include "runtime/reference/reference.h"
#include "tests/support/test_support.h"

namespace {

g3::ModelConfig tiny_model(int window) {
  g3::ModelConfig m = g3::builtin_model("4b");
  m.name = "tiny";
  m.hidden_size = 32;
  m.num_layers = 6;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 8;
  m.sliding_window = window;
  m.query_pre_attn_scalar = 8;
  m.layer_types.assign(6, g3::LayerKind::Local);
  m.layer_types[5] = g3::LayerKind::Global;
  return m;
}

// The causal mask of `rows` queries over `S` slots: query t sees slots 0..t.
std::vector<uint8_t> causal_slots(int64_t rows, int64_t S) {
  std::vector<uint8_t> mask(size_t(rows * S), 0);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t s = 0; s <= t; ++s) mask[size_t(t * S + s)] = 1;
  return mask;
}

}  // namespace

TEST_CASE("SPEC 1.4 sliding mask: W = 2 over positions 0..5", "[reference][mask]") {
  for (int t = 0; t < 6; ++t)
    for (int s = 0; s < 6; ++s) CHECK(g3::ref::sliding_visible(t, s, 2) == (std::abs(t - s) <= 1));
}

TEST_CASE("SPEC 1.4 sliding mask: packed positions compare raw positions", "[reference][mask]") {
  const int pos[7] = {0, 1, 2, 3, 0, 1, 2};
  // Token 4 (position 0) and token 3 (position 3) are far apart; token 4 and
  // token 0 (both position 0) are not separated by the sliding mask.
  CHECK(g3::ref::sliding_visible(pos[4], pos[0], 2));
  CHECK(g3::ref::sliding_visible(pos[4], pos[1], 2));
  CHECK_FALSE(g3::ref::sliding_visible(pos[4], pos[3], 2));
  CHECK(g3::ref::sliding_visible(pos[6], pos[3], 2));
}

TEST_CASE("SPEC 1.4 sliding mask: cache positions [0,0,0,1,2,3], W = 3", "[reference][mask]") {
  const int cache_pos[6] = {0, 0, 0, 1, 2, 3};
  auto visible_slots = [&](int q) {
    std::vector<int> v;
    for (int s = 0; s < 6; ++s)
      if (g3::ref::sliding_visible(q, cache_pos[s], 3)) v.push_back(s);
    return v;
  };
  CHECK(visible_slots(4) == std::vector<int>{4, 5});
  CHECK(visible_slots(5) == std::vector<int>{5});
  CHECK(visible_slots(6).empty());
}

TEST_CASE("official cache: prefill then decode steps equal a one-shot prefill", "[reference][cache]") {
  const int W = 4;
  auto m = tiny_model(W);
  for (int layer : {0, 5}) {  // local and global, T > W
    auto spec = g3::layer_spec(m, layer);
    auto w = g3::random_layer_weights(spec, 7, g3::DType::F32);
    const int64_t S = 16, T = 14, P = 9, D = spec.hidden_size;
    auto x = g3test::randn(size_t(T * D), 11);
    std::vector<int32_t> pos(T);
    for (int t = 0; t < T; ++t) pos[t] = t;

    // One shot: T tokens into an empty cache of S slots; slot s holds token s.
    auto c1 = g3::ref::Cache::zeros(1, S, spec.num_kv_heads, spec.head_dim);
    const std::vector<uint8_t> mask = causal_slots(T, S);
    std::vector<float> y1(size_t(T * D));
    g3::ref::block(spec, w, x.data(), pos.data(), 1, T, mask.data(), &c1, y1.data(), nullptr);
    CHECK(c1.end_index == T);

    // Prefill P tokens, then T - P decode steps of one token.
    auto c2 = g3::ref::Cache::zeros(1, S, spec.num_kv_heads, spec.head_dim);
    const std::vector<uint8_t> pm = causal_slots(P, S);
    std::vector<float> y2(size_t(T * D));
    g3::ref::block(spec, w, x.data(), pos.data(), 1, P, pm.data(), &c2, y2.data(), nullptr);
    for (int t = P; t < T; ++t) {
      std::vector<uint8_t> dm(size_t(S), 0);
      for (int s = 0; s < c2.end_index + 1; ++s) dm[s] = 1;  // SPEC 1.4 decode mask
      g3::ref::block(spec, w, &x[t * D], &pos[t], 1, 1, dm.data(), &c2, &y2[t * D], nullptr);
    }
    double mx = 0;
    for (size_t i = 0; i < y1.size(); ++i) mx = std::max(mx, double(std::fabs(y1[i] - y2[i])));
    INFO("layer " << layer << " max diff " << mx);
    CHECK(mx < 1e-5);
    CHECK(c1.positions == c2.positions);
  }
}

TEST_CASE("a fully masked row gets the official uniform average, not NaN", "[reference]") {
  auto m = tiny_model(4);
  auto spec = g3::layer_spec(m, 5);
  auto w = g3::random_layer_weights(spec, 3, g3::DType::F32);
  const int64_t T = 3, D = spec.hidden_size;
  auto x = g3test::randn(size_t(T * D), 5);
  std::vector<int32_t> pos = {0, 1, 2};
  std::vector<uint8_t> mask(size_t(T * T), 0);  // nothing visible anywhere
  std::vector<float> attn(size_t(T * D)), y(size_t(T * D));
  g3::ref::block(spec, w, x.data(), pos.data(), 1, T, mask.data(), nullptr, y.data(), attn.data());
  for (float v : attn) REQUIRE(std::isfinite(v));
  // Every row averages the same three values uniformly: identical outputs.
  for (int64_t d = 0; d < D; ++d) {
    CHECK(attn[d] == Approx(attn[D + d]).margin(1e-6));
    CHECK(attn[d] == Approx(attn[2 * D + d]).margin(1e-6));
  }
}

TEST_CASE("the contract path on the reference kernels equals the official block", "[reference][contract]") {
  auto m = tiny_model(5);
  for (int layer : {0, 5})
    for (auto kv : {g3::DType::F32, g3::DType::BF16}) {
      auto spec = g3::layer_spec(m, layer);
      auto w = g3::random_layer_weights(spec, 9, g3::DType::BF16);
      const int64_t B = 2, T = 13, D = spec.hidden_size;
      auto x = g3test::randn(size_t(B * T * D), 13);
      std::vector<int32_t> pos(B * T), real(B * T, 1);
      for (int t = 0; t < T; ++t) {
        pos[t] = t;
        pos[T + t] = t < 3 ? 1 : t - 3;  // row 1 left-padded by 3
        real[T + t] = t >= 3;
      }
      std::vector<float> want(size_t(B * T * D)), got(size_t(B * T * D));
      auto mask = g3::ref::causal_mask(real.data(), B, T);
      g3::ref::block(spec, w, x.data(), pos.data(), B, T, mask.data(), nullptr, want.data(), nullptr);
      auto L = g3::prepare_layer(spec, w, kv, "reference", "scalar");
      g3::run_block_nocache(L, x.data(), pos.data(), real.data(), B, T, got.data(), nullptr);
      // bf16 K/V: each stored element is rounded to 8 significant bits
      // (relative 2^-9); through softmax and P.V that stays below ~1e-2 here.
      double tol = kv == g3::DType::F32 ? 1e-5 : 3e-2;
      double mx = 0;
      for (int64_t r = 0; r < B * T; ++r) {
        if (!real[r]) continue;
        for (int64_t d = 0; d < D; ++d) mx = std::max(mx, double(std::fabs(want[r * D + d] - got[r * D + d])));
      }
      INFO("layer " << layer << " kv " << g3::to_string(kv) << " max diff " << mx);
      CHECK(mx < tol);
    }
}
