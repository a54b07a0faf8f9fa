#include "runtime/reference/reference.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "generator/bf16.h"
#include "generator/errors.h"
#include "templates/mask_rule.h"

namespace g3::ref {

void rms_norm(const float* x, int64_t n, const float* w, double eps, float* y) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  double r = 1.0 / std::sqrt(ss / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i] * r * (1.0 + w[i]));
}

void rope(float* x, int64_t dh, int64_t pos, double base, double scale) {
  const int64_t half = dh / 2;
  for (int64_t i = 0; i < half; ++i) {
    double timescale = std::pow(base, 2.0 * double(i) / double(dh));
    double theta = double(pos) / timescale / scale;
    double c = std::cos(theta), s = std::sin(theta);
    double x1 = x[i], x2 = x[i + half];
    x[i] = static_cast<float>(x1 * c - x2 * s);
    x[i + half] = static_cast<float>(x2 * c + x1 * s);
  }
}

bool sliding_visible(int64_t qpos, int64_t kpos, int64_t window) {
  return kpos > qpos - window && kpos < qpos + window;
}

Cache Cache::zeros(int64_t B, int64_t S, int Nkv, int dh) {
  Cache c;
  c.B = B;
  c.S = S;
  c.Nkv = Nkv;
  c.dh = dh;
  c.k.assign(size_t(B * S * Nkv * dh), 0.f);
  c.v.assign(size_t(B * S * Nkv * dh), 0.f);
  c.positions.assign(size_t(B * S), 0);
  return c;
}

std::vector<uint8_t> causal_mask(const int32_t* key_real, int64_t B, int64_t T) {
  std::vector<uint8_t> m(size_t(B * T * T), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = 0; s <= t; ++s) m[(b * T + t) * T + s] = key_real ? key_real[b * T + s] != 0 : 1;
  return m;
}

namespace {
// An operand of a product in a compute mode: as it is, or rounded to bf16.
// The mode is a template argument in the core and the GEMM so that the f32
// oracle's inner loops carry no branch (a branch per operand made them 3.4x
// slower).
template <bool kBf16>
double op(double x) {
  if constexpr (kBf16) return double(bf16_to_f32(f32_to_bf16(float(x))));
  return x;
}
}  // namespace

double operand(double x, int32_t compute) { return compute == G3_COMPUTE_BF16 ? op<true>(x) : x; }

// y[o] = sum_d x[d] * W[o][d] for an HF [out, in] matrix (widened to f32 once).
static void project(const std::vector<float>& w, int64_t rows, int64_t cols, const float* x, float* y) {
  for (int64_t o = 0; o < rows; ++o) {
    double acc = 0;
    const float* wr = &w[o * cols];
    for (int64_t d = 0; d < cols; ++d) acc += double(x[d]) * wr[d];
    y[o] = static_cast<float>(acc);
  }
}

void attention(const LayerSpec& sp, const LayerWeights& w, const float* u_in, const int32_t* positions, int64_t B,
               int64_t T, const uint8_t* mask, Cache* cache, float* out, DType kv_dtype, DType compute) {
  const int64_t D = sp.hidden_size, H = sp.head_dim, N = sp.num_heads, K = sp.num_kv_heads, G = N / K;
  const int32_t cm = compute == DType::BF16 ? G3_COMPUTE_BF16 : G3_COMPUTE_F32;
  // In bf16 compute every input of a dot product is rounded; as operands
  // they are used nowhere else, so they are rounded once, in place.
  auto as_operands = [cm](std::vector<float>& v) {
    for (float& e : v) e = float(operand(e, cm));
    return v;
  };
  // Steps A-C: projections, QK-norm, RoPE, then q *= alpha (k is never scaled).
  std::vector<float> wq = w.q_proj.to_f32(), wk = w.k_proj.to_f32(), wv = w.v_proj.to_f32(), wo = w.o_proj.to_f32();
  for (auto* m : {&wq, &wk, &wv, &wo}) as_operands(*m);
  std::vector<float> u(u_in, u_in + B * T * D);
  as_operands(u);
  std::vector<float> q(size_t(B * T * N * H)), k(size_t(B * T * K * H)), v(size_t(B * T * K * H));
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const float* ub = &u[bt * D];
    project(wq, N * H, D, ub, &q[bt * N * H]);
    project(wk, K * H, D, ub, &k[bt * K * H]);
    project(wv, K * H, D, ub, &v[bt * K * H]);
    const int64_t pos = positions[bt];
    for (int64_t n = 0; n < N; ++n) {
      float* qh = &q[(bt * N + n) * H];
      rms_norm(qh, H, w.q_norm.data(), sp.rms_eps, qh);
      rope(qh, H, pos, sp.rope_base, sp.rope_scale);
      for (int64_t h = 0; h < H; ++h) qh[h] = static_cast<float>(double(qh[h]) * double(sp.alpha));
    }
    for (int64_t j = 0; j < K; ++j) {
      float* kh = &k[(bt * K + j) * H];
      rms_norm(kh, H, w.k_norm.data(), sp.rms_eps, kh);
      rope(kh, H, pos, sp.rope_base, sp.rope_scale);
    }
  }
  // K and V as stored: rounded once to bf16 when the cache holds bf16.
  if (kv_dtype == DType::BF16) {
    for (float& e : k) e = bf16_to_f32(f32_to_bf16(e));
    for (float& e : v) e = bf16_to_f32(f32_to_bf16(e));
  }
  // q, K and V as the logits and P.V see them.
  as_operands(q);
  as_operands(k);
  as_operands(v);

  // Step D: the cache write, or the fresh rows as keys.
  int64_t S = T;
  const float *keys = k.data(), *vals = v.data();
  std::vector<int32_t> kpos(positions, positions + B * T);
  if (cache) {
    if (cache->B != B || cache->Nkv != K || cache->dh != H) throw std::invalid_argument("reference: cache shape");
    if (T > cache->S) throw InputError("reference: " + std::to_string(T) + " new tokens exceed the cache length");
    S = cache->S;
    // dynamic_update_slice clamps the start so the whole update fits.
    const int64_t start = std::min(cache->end_index % S, S - T);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t slot = start + t;
        std::copy_n(&k[(b * T + t) * K * H], K * H, &cache->k[(b * S + slot) * K * H]);
        std::copy_n(&v[(b * T + t) * K * H], K * H, &cache->v[(b * S + slot) * K * H]);
        cache->positions[b * S + slot] = positions[b * T + t];
      }
    cache->end_index += T;
    keys = cache->k.data();
    vals = cache->v.data();
    kpos = cache->positions;
  }

  // Steps E-I per (b, t, n): logits over all S slots, masked logits replaced
  // by K_MASK, softmax over all S, weighted sum of values.
  std::vector<double> logits(static_cast<size_t>(S));
  std::vector<float> enc(size_t(N * H));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t qp = positions[b * T + t];
      for (int64_t n = 0; n < N; ++n) {
        const int64_t j = n / G;  // contiguous groups (SPEC 1.3 step E)
        const float* qh = &q[((b * T + t) * N + n) * H];
        double mx = -INFINITY;
        for (int64_t s = 0; s < S; ++s) {
          bool visible = mask[(b * T + t) * S + s] != 0;
          if (sp.window > 0) visible = visible && sliding_visible(qp, kpos[b * S + s], sp.window);
          double l = kMask;
          if (visible) {
            const float* kh = &keys[((b * S + s) * K + j) * H];
            l = 0;
            for (int64_t h = 0; h < H; ++h) l += double(qh[h]) * kh[h];
          }
          logits[s] = l;
          mx = std::max(mx, l);
        }
        double sum = 0;
        for (int64_t s = 0; s < S; ++s) sum += (logits[s] = std::exp(logits[s] - mx));
        for (int64_t h = 0; h < H; ++h) {
          double acc = 0;
          for (int64_t s = 0; s < S; ++s) acc += operand(logits[s], cm) * vals[((b * S + s) * K + j) * H + h];
          // The attention output is an input of o_proj's dot products.
          enc[n * H + h] = static_cast<float>(operand(acc / sum, cm));
        }
      }
      // Step J: output projection over (n, h).
      project(wo, D, N * H, enc.data(), out + (b * T + t) * D);
    }
}

void block(const LayerSpec& sp, const LayerWeights& w, const float* x, const int32_t* positions, int64_t B,
           int64_t T, const uint8_t* mask, Cache* cache, float* block_out, float* attn_out, DType kv_dtype,
           DType compute) {
  const int64_t D = sp.hidden_size;
  std::vector<float> u(size_t(B * T * D)), a(size_t(B * T * D));
  for (int64_t r = 0; r < B * T; ++r) rms_norm(x + r * D, D, w.input_norm.data(), sp.rms_eps, &u[r * D]);
  attention(sp, w, u.data(), positions, B, T, mask, cache, a.data(), kv_dtype, compute);
  if (attn_out) std::copy(a.begin(), a.end(), attn_out);
  for (int64_t r = 0; r < B * T; ++r) {
    std::vector<float> pn(static_cast<size_t>(D));
    rms_norm(&a[r * D], D, w.post_norm.data(), sp.rms_eps, pn.data());
    for (int64_t d = 0; d < D; ++d) block_out[r * D + d] = static_cast<float>(double(x[r * D + d]) + pn[d]);
  }
}

// ---------------------------------------------------------------------------
// The kernel contract in scalar code.

static float load_kv(const void* base, int32_t dtype, int64_t i) {
  if (dtype == G3_DTYPE_F32) return static_cast<const float*>(base)[i];
  return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
}

static void store_kv(void* base, int32_t dtype, int64_t i, float v) {
  if (dtype == G3_DTYPE_F32) static_cast<float*>(base)[i] = v;
  else static_cast<uint16_t*>(base)[i] = f32_to_bf16(v);
}

void qk(const g3_qk_args* a) {
  const int64_t H = a->head_dim;
  std::vector<float> tmp(static_cast<size_t>(H));
  for (int64_t t = 0; t < a->T; ++t) {
    const int64_t pos = a->pos[t];
    for (int64_t n = 0; n < a->num_heads; ++n) {
      rms_norm(a->q + t * a->q_stride + n * H, H, a->q_norm, a->eps, tmp.data());
      rope(tmp.data(), H, pos, a->rope_base, a->rope_scale);
      float* dst = a->q_out + t * a->q_out_stride + n * H;
      for (int64_t h = 0; h < H; ++h) dst[h] = static_cast<float>(double(tmp[h]) * double(a->alpha));
    }
    if (a->slot[t] < 0) continue;
    for (int64_t j = 0; j < a->num_kv_heads; ++j) {
      rms_norm(a->k + t * a->kv_stride + j * H, H, a->k_norm, a->eps, tmp.data());
      rope(tmp.data(), H, pos, a->rope_base, a->rope_scale);
      const int64_t base = (j * a->cache_head_stride + a->slot[t]) * H;
      const float* vsrc = a->v + t * a->kv_stride + j * H;
      for (int64_t h = 0; h < H; ++h) {
        store_kv(a->k_cache, a->kv_dtype, base + h, tmp[h]);
        store_kv(a->v_cache, a->kv_dtype, base + h, vsrc[h]);
      }
    }
  }
}

namespace {
template <bool kBf16>
void core_impl(const g3_core_args* a) {
  const int64_t H = a->head_dim, G = a->group;
  std::vector<double> p(static_cast<size_t>(a->S)), acc(static_cast<size_t>(H));
  for (int64_t t = 0; t < a->T; ++t) {
    const g3_row_bounds rb = g3_bounds_of(a, t);
    for (int64_t g = 0; g < G; ++g) {
      const float* q = a->q + t * a->q_stride + g * H;
      float* o = a->out + t * a->out_stride + g * H;
      double mx = -INFINITY;
      for (int64_t s = 0; s < a->S; ++s) {
        const bool visible = g3_visible(rb, s, a->kpos[s], a->kvalid[s]);
        p[s] = -INFINITY;
        if (!visible) continue;
        double l = 0;
        for (int64_t h = 0; h < H; ++h)
          l += op<kBf16>(q[h]) * op<kBf16>(load_kv(a->k, a->kv_dtype, s * H + h));
        p[s] = l;
        mx = std::max(mx, l);
      }
      if (mx == -INFINITY) {  // no visible key: zeros (don't-care row)
        std::fill(o, o + H, 0.f);
        if (a->lse) a->lse[t * G + g] = -INFINITY;
        continue;
      }
      double sum = 0;
      for (int64_t s = 0; s < a->S; ++s) sum += (p[s] = p[s] == -INFINITY ? 0.0 : std::exp(p[s] - mx));
      // Hidden slots (p = 0 exactly) are never read: whatever they hold,
      // NaN included, cannot reach the output. In bf16 compute the weights
      // and values are rounded for the product, the sum stays exact. Slots
      // are the outer loop so that hidden ones are skipped once, not once
      // per dimension; each acc[h] still adds its terms in slot order.
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t s = 0; s < a->S; ++s) {
        if (p[s] == 0) continue;
        const double ps = op<kBf16>(p[s]);
        for (int64_t h = 0; h < H; ++h) acc[h] += ps * op<kBf16>(load_kv(a->v, a->kv_dtype, s * H + h));
      }
      for (int64_t h = 0; h < H; ++h) o[h] = static_cast<float>(acc[h] / sum);
      if (a->lse) a->lse[t * G + g] = static_cast<float>(mx + std::log(sum));
    }
  }
}
}  // namespace

void core(const g3_core_args* a) {
  if (a->compute == G3_COMPUTE_BF16) core_impl<true>(a);
  else core_impl<false>(a);
}

namespace {
template <bool kBf16>
void gemm_impl(const g3_gemm_args* a) {
  for (int64_t m = 0; m < a->M; ++m)
    for (int64_t n = a->n_begin; n < a->n_end; ++n) {
      const int64_t panel = n / G3_PANEL, j = n % G3_PANEL;
      double acc = 0;
      for (int64_t k = 0; k < a->K; ++k)
        acc += op<kBf16>(a->a[m * a->lda + k]) * op<kBf16>(load_kv(a->w, a->w_dtype, (panel * a->K + k) * G3_PANEL + j));
      a->c[m * a->ldc + n] = static_cast<float>(acc);
    }
}
}  // namespace

void gemm(const g3_gemm_args* a) {
  if (a->compute == G3_COMPUTE_BF16) gemm_impl<true>(a);
  else gemm_impl<false>(a);
}

void rmsnorm(const float* x, int64_t rows, int64_t n, int64_t x_stride, const float* w, float eps,
             const float* residual, float* y, int64_t y_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * y_stride;
    rms_norm(x + r * x_stride, n, w, eps, yr);
    if (residual)
      for (int64_t i = 0; i < n; ++i) yr[i] = static_cast<float>(double(yr[i]) + residual[r * y_stride + i]);
  }
}

const g3_kernel_table& kernel_table() {
  static const g3_kernel_table t{&qk, &core, &gemm, &rmsnorm};
  return t;
}

}  // namespace g3::ref
