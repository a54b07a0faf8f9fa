#include "tests/support/kernel_calls.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>

#include "generator/bf16.h"
#include "templates/mask_rule.h"

namespace g3test {

CoreCall CoreCall::random(const CoreSpec& spec) {
  CoreCall d;
  d.spec = spec;
  std::mt19937 rng(spec.seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<double> ud(0, 1);
  const int64_t T = spec.T, S = spec.S, H = spec.head_dim, G = spec.group;
  d.q_stride = G * H + 16;
  d.out_stride = G * H + 8;
  d.q.resize(size_t(T * d.q_stride));
  const float qs = spec.q_scale > 0 ? float(spec.q_scale) : 1.5f / std::sqrt(float(H));
  const bool uniform = spec.values == CoreSpec::Values::Uniform;
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  for (auto& x : d.q) x = uniform ? qs * U(rng) : nd(rng) * qs * (ud(rng) < spec.q_spikes ? 4.f : 1.f);
  d.kf.resize(size_t(S * H));
  d.vf.resize(d.kf.size());
  for (size_t i = 0; i < d.kf.size(); ++i) {
    d.kf[i] = uniform ? U(rng) : nd(rng);
    d.vf[i] = uniform ? 2.f * U(rng) : nd(rng);
  }
  if (spec.kv == g3::DType::BF16) {
    d.kb.resize(d.kf.size());
    d.vb.resize(d.vf.size());
    for (size_t i = 0; i < d.kf.size(); ++i) {
      d.kb[i] = g3::f32_to_bf16(d.kf[i]);
      d.vb[i] = g3::f32_to_bf16(d.vf[i]);
      d.kf[i] = g3::bf16_to_f32(d.kb[i]);
      d.vf[i] = g3::bf16_to_f32(d.vb[i]);
    }
  }
  d.kvalid.assign(size_t(S), 1);
  for (int64_t s = 0; s < S; ++s)
    if (ud(rng) < spec.invalid) d.kvalid[size_t(s)] = 0;
  d.qpos.resize(size_t(T));
  d.kpos.resize(size_t(S));
  if (spec.causal == G3_CAUSAL_SLOTS) {
    if (S != T) throw std::invalid_argument("CoreSpec: G3_CAUSAL_SLOTS needs S == T (the keys are the call's tokens)");
    int32_t p = 0;
    for (int64_t t = 0; t < T; ++t) {
      switch (rng() % 6) {
        case 0: p = 0; break;                      // a new packed document
        case 1: break;                             // a repeated position
        case 2: p += int32_t(rng() % 700); break;  // a gap, often past the window
        case 3: p = p > 5 ? p - 5 : 0; break;      // going backwards
        default: p += 1; break;
      }
      d.qpos[size_t(t)] = d.kpos[size_t(t)] = p;
    }
  } else {
    for (int64_t s = 0; s < S; ++s) d.kpos[size_t(s)] = spec.base + int32_t(s);
    if (spec.order == SlotOrder::Ring && S > 0) {
      std::rotate(d.kpos.begin(), d.kpos.begin() + S / 3, d.kpos.end());
      for (int64_t s = 0; s + 1 < S; s += 7) std::swap(d.kpos[size_t(s)], d.kpos[size_t(s + 1)]);
    } else if (spec.order == SlotOrder::Shuffled) {
      std::shuffle(d.kpos.begin(), d.kpos.end(), rng);
    }
    for (int64_t t = 0; t < T; ++t)
      d.qpos[size_t(t)] = spec.base + int32_t(spec.order == SlotOrder::Sorted ? S - T + t : S - 1 - t);
    if (T > 2) {
      d.qpos[0] = spec.base + 2;  // sees at most three keys
      d.qpos[1] = spec.base - 5;  // before every key: sees none
    }
    if (spec.shuffle_queries) std::shuffle(d.qpos.begin(), d.qpos.end(), rng);
    // Invalid slots may hold any position; some hold junk.
    for (int64_t s = 1; s < S; s += 2)
      if (!d.kvalid[size_t(s)]) d.kpos[size_t(s)] = s % 4 == 1 ? std::numeric_limits<int32_t>::min() + 5 : 1;
  }
  d.fill_invalid(std::numeric_limits<float>::quiet_NaN());
  return d;
}

g3_core_args CoreCall::args(float* out, float* lse) const {
  const bool bf16 = spec.kv == g3::DType::BF16;
  g3_core_args a{};
  a.T = spec.T;
  a.q = q.data();
  a.q_stride = q_stride;
  a.qpos = qpos.data();
  a.k = bf16 ? static_cast<const void*>(kb.data()) : kf.data();
  a.v = bf16 ? static_cast<const void*>(vb.data()) : vf.data();
  a.S = spec.S;
  a.kpos = kpos.data();
  a.kvalid = kvalid.data();
  a.out = out;
  a.out_stride = out_stride;
  a.lse = spec.lse ? lse : nullptr;
  a.head_dim = spec.head_dim;
  a.group = spec.group;
  a.window = spec.window;
  a.kv_dtype = bf16 ? G3_DTYPE_BF16 : G3_DTYPE_F32;
  a.causal = spec.causal;
  a.causal_offset = 0;
  a.compute = spec.compute == g3::DType::BF16 ? G3_COMPUTE_BF16 : G3_COMPUTE_F32;
  return a;
}

void CoreCall::fill_invalid(float value) {
  const int64_t H = spec.head_dim;
  for (int64_t s = 0; s < spec.S; ++s)
    if (!kvalid[size_t(s)])
      for (int64_t h = 0; h < H; ++h) {
        const size_t i = size_t(s * H + h);
        kf[i] = vf[i] = value;
        if (!kb.empty()) kb[i] = vb[i] = g3::f32_to_bf16(value);
      }
}

bool CoreCall::row_sees_a_key(int64_t t) const {
  const g3_core_args a = args(nullptr, nullptr);
  const g3_row_bounds rb = g3_bounds_of(&a, t);
  for (int64_t s = 0; s < spec.S; ++s)
    if (g3_visible(rb, s, kpos[size_t(s)], kvalid[size_t(s)])) return true;
  return false;
}

CoreCall::Outputs CoreCall::run(g3_core_fn fn) const {
  Outputs o;
  o.out.assign(size_t(spec.T * out_stride), kGarbage);
  o.lse.assign(size_t(spec.T * spec.group), kGarbage);
  const g3_core_args a = args(o.out.data(), o.lse.data());
  fn(&a);
  return o;
}

// ---------------------------------------------------------------------------

QkCall QkCall::random(const QkSpec& spec) {
  QkCall d;
  d.spec = spec;
  std::mt19937 rng(spec.seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int64_t H = spec.head_dim, T = spec.T;
  d.q_stride = spec.num_heads * H + 3;
  d.kv_stride = spec.num_kv_heads * H + 5;
  d.S = T + 7;
  d.q.resize(size_t(T * d.q_stride));
  d.k.resize(size_t(T * d.kv_stride));
  d.v.resize(d.k.size());
  d.q_norm.resize(size_t(H));
  d.k_norm.resize(size_t(H));
  for (auto& x : d.q) x = nd(rng) * 3.f;
  for (auto& x : d.k) x = nd(rng) * 3.f;
  for (auto& x : d.v) x = nd(rng);
  for (auto& x : d.q_norm) x = nd(rng) * 0.3f;
  for (auto& x : d.k_norm) x = nd(rng) * 0.3f;
  std::vector<int64_t> perm(size_t(d.S));
  for (int64_t s = 0; s < d.S; ++s) perm[size_t(s)] = s;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_int_distribution<int32_t> pd(0, 140000);
  d.pos.resize(size_t(T));
  d.slot.resize(size_t(T));
  for (int64_t t = 0; t < T; ++t) {
    d.pos[size_t(t)] = t % 3 == 0 ? pd(rng) : int32_t(t);
    d.slot[size_t(t)] = t % 5 == 4 ? -1 : perm[size_t(t)];
  }
  return d;
}

float QkCall::cache_at(const std::vector<uint8_t>& cache, size_t i) const {
  if (spec.kv == g3::DType::F32) {
    float f;
    std::memcpy(&f, cache.data() + i * 4, 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, cache.data() + i * 2, 2);
  return g3::bf16_to_f32(b);
}

g3_qk_args QkCall::args(Outputs& o) const {
  const int64_t H = spec.head_dim;
  o.q.assign(size_t(spec.T * spec.num_heads * H), kGarbage);
  o.k_cache.assign(size_t(spec.num_kv_heads * S * H) * kv_elem_size(), 0xAB);
  o.v_cache.assign(o.k_cache.size(), 0xCD);
  g3_qk_args a{};
  a.T = spec.T;
  a.num_heads = spec.num_heads;
  a.num_kv_heads = spec.num_kv_heads;
  a.q = q.data();
  a.q_stride = q_stride;
  a.k = k.data();
  a.v = v.data();
  a.kv_stride = kv_stride;
  a.pos = pos.data();
  a.q_norm = q_norm.data();
  a.k_norm = k_norm.data();
  a.q_out = o.q.data();
  a.q_out_stride = spec.num_heads * H;
  a.k_cache = o.k_cache.data();
  a.v_cache = o.v_cache.data();
  a.cache_head_stride = S;
  a.slot = slot.data();
  a.head_dim = spec.head_dim;
  a.kv_dtype = spec.kv == g3::DType::F32 ? G3_DTYPE_F32 : G3_DTYPE_BF16;
  a.alpha = spec.alpha;
  a.eps = 1e-6f;
  a.rope_base = spec.rope_base;
  a.rope_scale = spec.rope_scale;
  return a;
}

QkCall::Outputs QkCall::run(g3_qk_fn fn) const {
  Outputs o;
  const g3_qk_args a = args(o);
  fn(&a);
  return o;
}

}  // namespace g3test
