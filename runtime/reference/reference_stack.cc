#include "runtime/reference/reference_stack.h"

#include <algorithm>
#include <cmath>

#include "generator/bf16.h"
#include "generator/errors.h"

namespace g3 {

// ---------------------------------------------------------------------------
// ReferenceStack: the official layout in double.

namespace {

// sum_i a[i] * b[i] in double with eight independent partial sums: the
// reference is O(T^2) and one dependency chain would make --verify several
// times slower. The clones let the compiler use wide double vectors on
// machines that have them (a per-function target, never a global -m flag);
// every clone accumulates in double, so the oracle's precision is the same.
__attribute__((target_clones("avx512f", "avx2", "default"))) double dot(const float* a, const float* b, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += double(a[i + k]) * double(b[i + k]);
  for (; i < n; ++i) s[0] += double(a[i]) * double(b[i]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace

ReferenceStack::ReferenceStack(const ModelConfig& cfg, const WeightSource& weights, int64_t batch, int64_t cache_len,
                               ThreadPool& pool, DType kv_dtype, DType compute)
    : cfg_(cfg),
      B_(batch),
      S_(cache_len),
      pool_(pool),
      kv_dtype_(kv_dtype),
      compute_(compute == DType::BF16 ? G3_COMPUTE_BF16 : G3_COMPUTE_F32) {
  const std::vector<LayerSpec> specs = layer_specs(cfg);
  layers_.resize(specs.size());
  pool_.parallel_for(int64_t(specs.size()), [&](int64_t i) {
    Layer& L = layers_[size_t(i)];
    L.spec = specs[size_t(i)];
    LayerWeights w = weights(L.spec);
    L.wq = w.q_proj.to_f32();
    L.wk = w.k_proj.to_f32();
    L.wv = w.v_proj.to_f32();
    L.wo = w.o_proj.to_f32();
    // In bf16 compute the weights are dot-product inputs like any other.
    for (auto* m : {&L.wq, &L.wk, &L.wv, &L.wo})
      for (float& e : *m) e = float(ref::operand(e, compute_));
    L.q_norm = w.q_norm;
    L.k_norm = w.k_norm;
    L.input_norm = w.input_norm;
    L.post_norm = w.post_norm;
    L.cache = ref::Cache::zeros(batch, cache_len, L.spec.num_kv_heads, L.spec.head_dim);
  });
  slot_real_.assign(size_t(B_ * S_), 0);
}

void ReferenceStack::forward(const float* x, const int32_t* pos, const uint8_t* real, int64_t T, float* y) {
  if (T > S_) throw InputError("reference: " + std::to_string(T) + " tokens exceed the cache length");
  // dynamic_update_slice clamps the start so the whole update fits (SPEC 1.5).
  const int64_t start = std::min(end_index_ % S_, S_ - T);
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t t = 0; t < T; ++t) slot_real_[size_t(b * S_ + start + t)] = real ? real[b * T + t] != 0 : 1;
  const int64_t D = cfg_.hidden_size;
  std::vector<float> cur(x, x + B_ * T * D), nxt(size_t(B_ * T * D));
  for (size_t l = 0; l < layers_.size(); ++l) {
    block(layers_[l], cur.data(), pos, T, start, nxt.data());
    cur.swap(nxt);
    if (on_layer) on_layer(int(l));
  }
  std::copy(cur.begin(), cur.end(), y);
  end_index_ += T;
}

void ReferenceStack::block(Layer& L, const float* x, const int32_t* positions, int64_t T, int64_t start, float* y) {
  const LayerSpec& sp = L.spec;
  const int64_t D = sp.hidden_size, H = sp.head_dim, N = sp.num_heads, K = sp.num_kv_heads, G = N / K;
  const int64_t R = B_ * T, S = S_;
  std::vector<float> u(size_t(R * D)), q(size_t(R * N * H)), k(size_t(R * K * H)), v(size_t(R * K * H));
  std::vector<float> enc(size_t(R * N * H)), a(size_t(R * D));

  // SPEC 1.2 step 1 and 1.3 step A.
  pool_.parallel_for(R, [&](int64_t r) {
    ref::rms_norm(x + r * D, D, L.input_norm.data(), sp.rms_eps, &u[r * D]);
    for (int64_t d = 0; d < D; ++d) u[r * D + d] = float(ref::operand(u[r * D + d], compute_));
  });
  const int64_t QKV = (N + 2 * K) * H, cb = 128, ncb = (QKV + cb - 1) / cb;
  pool_.parallel_for(R * ncb, [&](int64_t i) {
    const int64_t r = i / ncb, c0 = (i % ncb) * cb, c1 = std::min(QKV, c0 + cb);
    const float* ur = &u[r * D];
    for (int64_t c = c0; c < c1; ++c) {
      if (c < N * H) q[r * N * H + c] = float(dot(ur, &L.wq[c * D], D));
      else if (c < (N + K) * H) k[r * K * H + c - N * H] = float(dot(ur, &L.wk[(c - N * H) * D], D));
      else v[r * K * H + c - (N + K) * H] = float(dot(ur, &L.wv[(c - (N + K) * H) * D], D));
    }
  });
  // Steps B-C: QK-norm, RoPE, then q *= alpha.
  pool_.parallel_for(R, [&](int64_t r) {
    const int64_t p = positions[r];
    for (int64_t n = 0; n < N; ++n) {
      float* qh = &q[(r * N + n) * H];
      ref::rms_norm(qh, H, L.q_norm.data(), sp.rms_eps, qh);
      ref::rope(qh, H, p, sp.rope_base, sp.rope_scale);
      for (int64_t h = 0; h < H; ++h) qh[h] = static_cast<float>(double(qh[h]) * double(sp.alpha));
    }
    for (int64_t j = 0; j < K; ++j) {
      float* kh = &k[(r * K + j) * H];
      ref::rms_norm(kh, H, L.k_norm.data(), sp.rms_eps, kh);
      ref::rope(kh, H, p, sp.rope_base, sp.rope_scale);
    }
    // K and V as the cache stores them (rounded once when it holds bf16),
    // then q, K and V as the logits and P.V see them (the compute mode).
    if (kv_dtype_ == DType::BF16)
      for (float* e : {&k[r * K * H], &v[r * K * H]})
        for (int64_t i = 0; i < K * H; ++i) e[i] = bf16_to_f32(f32_to_bf16(e[i]));
    for (int64_t i = 0; i < N * H; ++i) q[r * N * H + i] = float(ref::operand(q[r * N * H + i], compute_));
    for (float* e : {&k[r * K * H], &v[r * K * H]})
      for (int64_t i = 0; i < K * H; ++i) e[i] = float(ref::operand(e[i], compute_));
  });
  // Step D: the official cache write (every token, padding included).
  ref::Cache& C = L.cache;
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t slot = start + t, r = b * T + t;
      std::copy_n(&k[r * K * H], K * H, &C.k[(b * S + slot) * K * H]);
      std::copy_n(&v[r * K * H], K * H, &C.v[(b * S + slot) * K * H]);
      C.positions[size_t(b * S + slot)] = positions[r];
    }
  C.end_index += T;
  // Steps E-I: logits over all S slots, K_MASK for hidden ones, softmax over
  // all S (a row with no visible key averages every slot, as the official
  // code does), weighted values.
  pool_.parallel_for(R * N, [&](int64_t i) {
    const int64_t r = i / N, n = i % N, b = r / T, t = r % T, j = n / G;
    const int64_t qp = positions[r];
    const float* qh = &q[(r * N + n) * H];
    std::vector<double> p(static_cast<size_t>(S));
    double mx = -INFINITY;
    for (int64_t s = 0; s < S; ++s) {
      bool visible = slot_real_[size_t(b * S + s)] && s <= start + t;
      if (sp.window > 0) visible = visible && ref::sliding_visible(qp, C.positions[size_t(b * S + s)], sp.window);
      p[size_t(s)] = visible ? dot(qh, &C.k[((b * S + s) * K + j) * H], H) : ref::kMask;
      mx = std::max(mx, p[size_t(s)]);
    }
    double sum = 0;
    for (int64_t s = 0; s < S; ++s) sum += (p[size_t(s)] = std::exp(p[size_t(s)] - mx));
    std::vector<double> acc(size_t(H), 0.0);
    for (int64_t s = 0; s < S; ++s) {
      if (p[size_t(s)] == 0) continue;  // exp(K_MASK - max) underflows to exactly 0
      const float* vh = &C.v[((b * S + s) * K + j) * H];
      const double ps = ref::operand(p[size_t(s)], compute_);
      for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += ps * vh[h];
    }
    // The attention output is an input of o_proj's dot products.
    for (int64_t h = 0; h < H; ++h)
      enc[(r * N + n) * H + h] = static_cast<float>(ref::operand(acc[size_t(h)] / sum, compute_));
  });
  // Step J and SPEC 1.2 steps 3-4.
  const int64_t db = 128, ndb = (D + db - 1) / db;
  pool_.parallel_for(R * ndb, [&](int64_t i) {
    const int64_t r = i / ndb, d0 = (i % ndb) * db, d1 = std::min(D, d0 + db);
    for (int64_t d = d0; d < d1; ++d) a[r * D + d] = float(dot(&enc[r * N * H], &L.wo[d * N * H], N * H));
  });
  pool_.parallel_for(R, [&](int64_t r) {
    std::vector<float> pn(static_cast<size_t>(D));
    ref::rms_norm(&a[r * D], D, L.post_norm.data(), sp.rms_eps, pn.data());
    for (int64_t d = 0; d < D; ++d) y[r * D + d] = static_cast<float>(double(x[r * D + d]) + pn[size_t(d)]);
  });
}

}  // namespace g3
