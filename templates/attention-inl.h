// Highway kernels of the attention stages of the kernel contract
// (kernel_contract.h): g3_qk_fn (SPEC 1.3 steps B-D) and g3_core_fn (steps
// E-I), written once and compiled per Highway target.
//
// Every function here is a template over the key's compile-time constants
// (head_dim, group, window, KV dtype; 0 or -1 means "read it from the args"),
// so the same text serves the specialised kernels that g3attn-gen emits for a
// model's keys and the generic kernel for any other key. The per-key entry
// points live in attention_key-inl.h; this header is included once per target
// (Highway's HWY_TARGET_TOGGLE idiom) and has no entry points of its own.
//
// Numerics: f32 arithmetic and f32 accumulation everywhere; bf16 KV elements
// are widened on load and written with round-to-nearest-even. RoPE angles
// are computed in double exactly as the scalar reference does.
//
// Names follow SPEC.md's notation where they overlap it: H is head_dim, G the
// group size, a->S the number of key slots, W the window. NL is the number of
// f32 lanes of a vector (hn::Lanes), never SPEC's N (query heads, which only
// appear as a->num_heads); `logits` is a tile's logits, replaced in place by
// their unnormalised probabilities once the softmax step has run.

// Per-target include guard: toggled by foreach_target between passes.
#if defined(G3_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef G3_ATTENTION_INL_H_
#undef G3_ATTENTION_INL_H_
#else
#define G3_ATTENTION_INL_H_
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
#include "bf16-inl.h"
#include "kernel_contract.h"
#include "mask_rule.h"
#include "scratch.h"
#include "softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace g3 {
namespace HWY_NAMESPACE {
namespace attn {

namespace hn = hwy::HWY_NAMESPACE;
using flash::FinishRow;
using flash::kNegBig;
using flash::SoftmaxTile;

// Keys per tile of the attention core. The structured mask is summarised per
// tile (min/max stored position of its valid slots), which is what lets the
// core skip tiles that the causal or window rule hides from a block of rows.
constexpr size_t kBk = 64;
// Query rows (token x group head) per block of the prefill core: large enough
// that each K/V tile, once widened and transposed, is reused many times while
// it sits in L2; small enough that the running outputs stay in L2 too.
constexpr size_t kMacroRows = 128;
// Up to this many rows, the core streams K/V row by row (decode) instead of
// transposing key tiles: a transposed tile only pays off when many rows use it.
constexpr size_t kDecodeRows = 8;
// Rows of one register tile: 8 rows x 2 vectors of keys (or of head_dim) is
// 16 accumulators, which fits the 32 vector registers of AVX-512; the 16
// registers of SSE/AVX2 hold 4 x 2.
#if HWY_TARGET <= HWY_AVX3
constexpr size_t kRows = 8;
#else
constexpr size_t kRows = 4;
#endif
HWY_INLINE size_t RoundUp(size_t x, size_t m) { return (x + m - 1) / m * m; }

// ---------------------------------------------------------------------------
// KV element access. kKV is G3_DTYPE_F32 or G3_DTYPE_BF16.

// Lanes(d) elements starting at element i, as f32 (bf16 is the upper half of
// an f32, so widening is a zero-extend and a shift). kRound: rounded to bf16
// as the bf16 compute mode's dot products see them (exact for bf16 K/V).
template <int kKV, bool kRound = false, class D>
HWY_INLINE hn::Vec<D> LoadKV(D d, const void* base, size_t i) {
  if constexpr (kKV == G3_DTYPE_F32) {
    const auto v = hn::LoadU(d, static_cast<const float*>(base) + i);
    if constexpr (kRound) return bf16::Round(d, v);
    return v;
  } else {
    const hn::Rebind<uint16_t, D> d16;
    const hn::Rebind<uint32_t, D> d32;
    const auto w = hn::PromoteTo(d32, hn::LoadU(d16, static_cast<const uint16_t*>(base) + i));
    return hn::BitCast(d, hn::ShiftLeft<16>(w));
  }
}

template <int kKV, class D>
HWY_INLINE void StoreKV(D d, hn::Vec<D> v, void* base, size_t i) {
  if constexpr (kKV == G3_DTYPE_F32) {
    hn::StoreU(v, d, static_cast<float*>(base) + i);
  } else {
    bf16::Store(d, v, static_cast<uint16_t*>(base) + i);
  }
}

// ---------------------------------------------------------------------------
// Stage B-D: QK RMSNorm (1 + w), half-split RoPE, q *= alpha, cache write.

// y = RoPE(RMSNorm(x) * (1 + w)) * scale for one head vector of H floats
// (SPEC 2.1 and 2.2): pairs are (i, i + H/2); cs/sn hold cos and sin of the
// token's angles. d must divide H/2.
template <class D>
HWY_INLINE void NormRope(D d, const float* x, const float* w, float eps, const float* cs, const float* sn, size_t H,
                         float scale, float* y) {
  const size_t NL = hn::Lanes(d), half = H / 2;
  auto s0 = hn::Zero(d), s1 = hn::Zero(d);
  for (size_t i = 0; i < half; i += NL) {
    const auto a = hn::LoadU(d, x + i), b = hn::LoadU(d, x + half + i);
    s0 = hn::MulAdd(a, a, s0);
    s1 = hn::MulAdd(b, b, s1);
  }
  const double ss = double(hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1))));
  // The reference takes 1/sqrt in double; doing the same keeps us within an
  // ulp of it for the scale factor.
  const auto r = hn::Set(d, static_cast<float>(1.0 / sqrt(ss / double(H) + double(eps))));
  const auto one = hn::Set(d, 1.0f), sc = hn::Set(d, scale);
  for (size_t i = 0; i < half; i += NL) {
    const auto a = hn::Mul(hn::Mul(hn::LoadU(d, x + i), r), hn::Add(one, hn::LoadU(d, w + i)));
    const auto b = hn::Mul(hn::Mul(hn::LoadU(d, x + half + i), r), hn::Add(one, hn::LoadU(d, w + half + i)));
    const auto c = hn::LoadU(d, cs + i), s = hn::LoadU(d, sn + i);
    // x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin (SPEC 2.2), then alpha (step C.2).
    hn::StoreU(hn::Mul(hn::NegMulAdd(b, s, hn::Mul(a, c)), sc), d, y + i);
    hn::StoreU(hn::Mul(hn::MulAdd(a, s, hn::Mul(b, c)), sc), d, y + half + i);
  }
}

// The whole QK stage for one call. kDH: head_dim or 0 (runtime).
template <int kDH, int kKV, class D>
HWY_NOINLINE void QkImpl(D d, const g3_qk_args* a, double base, double rscale, float alpha) {
  const size_t H = kDH ? size_t(kDH) : size_t(a->head_dim), half = H / 2, NL = hn::Lanes(d);
  static thread_local Scratch<float> scratch;
  const size_t hp = RoundUp(half, 16), h2 = RoundUp(H, 16);
  float* cs = scratch.Get(2 * hp + h2);
  float* sn = cs + hp;
  float* tmp = sn + hp;
  // Inverse timescales of the key (SPEC 2.2): timescale_i = base^(2i/H). They
  // are per call, not per token: pow is the expensive part.
  double ts_stack[512];
  double* ts = ts_stack;  // H <= 1024 by config validation, so half <= 512
  for (size_t i = 0; i < half; ++i) ts[i] = pow(base, 2.0 * double(i) / double(H));
  for (int64_t t = 0; t < a->T; ++t) {
    // Angles once per token, shared by every head: theta_i = pos / ts_i / sigma,
    // in double as the reference computes them, rounded to f32 after cos/sin.
    const double pos = double(a->pos[t]);
    for (size_t i = 0; i < half; ++i) {
      const double th = pos / ts[i] / rscale;
      cs[i] = static_cast<float>(cos(th));
      sn[i] = static_cast<float>(sin(th));
    }
    for (int32_t n = 0; n < a->num_heads; ++n) {
      NormRope(d, a->q + t * a->q_stride + n * int64_t(H), a->q_norm, a->eps, cs, sn, H, alpha,
               a->q_out + t * a->q_out_stride + n * int64_t(H));
    }
    const int64_t slot = a->slot[t];
    if (slot < 0) continue;
    for (int32_t j = 0; j < a->num_kv_heads; ++j) {
      const size_t dst = size_t((j * a->cache_head_stride + slot) * int64_t(H));
      // Keys are normed and rotated but never scaled (SPEC 1.3 step C).
      NormRope(d, a->k + t * a->kv_stride + j * int64_t(H), a->k_norm, a->eps, cs, sn, H, 1.0f, tmp);
      const float* v = a->v + t * a->kv_stride + j * int64_t(H);
      for (size_t i = 0; i < H; i += NL) {
        StoreKV<kKV>(d, hn::LoadU(d, tmp + i), a->k_cache, dst + i);
        StoreKV<kKV>(d, hn::LoadU(d, v + i), a->v_cache, dst + i);  // V raw
      }
    }
  }
}

// Picks a vector width that divides H/2: the full vector for every real
// Gemma 3 head_dim, two lanes for odd shapes of test configs.
template <int kDH, int kKV>
HWY_INLINE void QkDispatchWidth(const g3_qk_args* a, double base, double rscale, float alpha) {
  const hn::ScalableTag<float> df;
  // A specialised head_dim that the full vector divides needs (and compiles)
  // only the full-width instance.
  if constexpr (kDH != 0 && (size_t(kDH) / 2) % hn::MaxLanes(df) == 0) {
    QkImpl<kDH, kKV>(df, a, base, rscale, alpha);
  } else {
    const size_t half = (kDH ? size_t(kDH) : size_t(a->head_dim)) / 2;
    if (half % hn::Lanes(df) == 0) {
      QkImpl<kDH, kKV>(df, a, base, rscale, alpha);
    } else {
      QkImpl<kDH, kKV>(hn::CappedTag<float, 1>(), a, base, rscale, alpha);
    }
  }
}

// kKV < 0: the KV dtype comes from the args.
template <int kDH, int kKV>
HWY_INLINE void Qk(const g3_qk_args* a, double base, double rscale, float alpha) {
  if constexpr (kKV >= 0) {
    QkDispatchWidth<kDH, kKV>(a, base, rscale, alpha);
  } else if (a->kv_dtype == G3_DTYPE_BF16) {
    QkDispatchWidth<kDH, G3_DTYPE_BF16>(a, base, rscale, alpha);
  } else {
    QkDispatchWidth<kDH, G3_DTYPE_F32>(a, base, rscale, alpha);
  }
}

// ---------------------------------------------------------------------------
// Stage E-I: the attention core.
//
// Rows are (token t, group head g) pairs, row i = t * G + g. Which key slots
// a row sees is the contract's structured mask, decided by mask_rule.h (the
// one copy every backend uses): per row, bounds on the stored position and
// on the slot; per tile of kBk slots, a summary that classifies the whole
// tile against a block of rows.

// Positions and validity of one tile as int32 lanes, padded past S with
// invalid slots so vector code may always run over kBk keys.
HWY_INLINE void TileMaskData(const g3_core_args* a, size_t k, int32_t* kp, int32_t* kv) {
  const int64_t s0 = int64_t(k * kBk);
  for (size_t i = 0; i < kBk; ++i) {
    const int64_t s = s0 + int64_t(i);
    const bool in = s < a->S;
    kp[i] = in ? a->kpos[s] : 0;
    kv[i] = in && a->kvalid[s] ? -1 : 0;
  }
}

// V rows [s0, s0 + nk) for the P.V product, as a pointer the caller may read
// nk rows from: the cache itself when every slot is valid, else a copy in
// `clean` (nk x H elements of the cache's type) whose invalid rows are zero.
// Their probabilities are exactly 0, but 0 * NaN is NaN and an invalid slot
// may hold anything (never written, or a padded token's values).
template <int kKV>
HWY_INLINE const void* CleanValues(const g3_core_args* a, size_t s0, size_t nk, size_t H, void* clean) {
  const size_t esz = kKV == G3_DTYPE_F32 ? 4 : 2, row = H * esz;
  const uint8_t* v = static_cast<const uint8_t*>(a->v) + s0 * row;
  size_t s = 0;
  while (s < nk && a->kvalid[s0 + s]) ++s;
  if (s == nk) return v;
  uint8_t* dst = static_cast<uint8_t*>(clean);
  for (s = 0; s < nk; ++s) {
    if (a->kvalid[s0 + s]) {
      memcpy(dst + s * row, v + s * row, row);
    } else {
      memset(dst + s * row, 0, row);
    }
  }
  return dst;
}

// O[r] = O[r] * corr[r] + sum_{s < nk} P[r][s] * V[s] for R rows (SPEC 1.3
// step I; P row stride kBk, O row stride H), vectorised over head_dim in
// chunks of C vectors with R x C accumulators kept in registers while the
// chunk runs over all nk keys.
template <size_t R, size_t C, int kKV, class D>
HWY_INLINE void PVTile(D d, const float* P, const float* corr, const void* V, size_t nk, size_t H, float* O) {
  const size_t NL = hn::Lanes(d);
  size_t h = 0;
  for (; h + C * NL <= H; h += C * NL) {
    hn::Vec<D> acc[R][C];
    for (size_t r = 0; r < R; ++r) {
      const auto c = hn::Set(d, corr[r]);
      for (size_t j = 0; j < C; ++j) acc[r][j] = hn::Mul(hn::LoadU(d, O + r * H + h + j * NL), c);
    }
    for (size_t s = 0; s < nk; ++s) {
      hn::Vec<D> v[C];
      for (size_t j = 0; j < C; ++j) v[j] = LoadKV<kKV>(d, V, s * H + h + j * NL);
      for (size_t r = 0; r < R; ++r) {
        const auto p = hn::Set(d, P[r * kBk + s]);
        for (size_t j = 0; j < C; ++j) acc[r][j] = hn::MulAdd(p, v[j], acc[r][j]);
      }
    }
    for (size_t r = 0; r < R; ++r)
      for (size_t j = 0; j < C; ++j) hn::StoreU(acc[r][j], d, O + r * H + h + j * NL);
  }
  for (; h < H; h += NL) {  // head_dim not a multiple of C vectors
    hn::Vec<D> a0[R];
    for (size_t r = 0; r < R; ++r) a0[r] = hn::Mul(hn::LoadU(d, O + r * H + h), hn::Set(d, corr[r]));
    for (size_t s = 0; s < nk; ++s) {
      const auto v0 = LoadKV<kKV>(d, V, s * H + h);
      for (size_t r = 0; r < R; ++r) a0[r] = hn::MulAdd(hn::Set(d, P[r * kBk + s]), v0, a0[r]);
    }
    for (size_t r = 0; r < R; ++r) hn::StoreU(a0[r], d, O + r * H + h);
  }
}

// Logits of R rows against one transposed key tile: logits[r][s] = sum_h
// Qt[h][r] * Kt[h][s] (SPEC 1.3 step E). A register tile of R rows x 2
// vectors of keys; each step loads two key vectors and broadcasts R query
// elements, so K comes from L1/L2 once per R rows.
template <size_t R, class DK>
HWY_INLINE void QKTile(DK dk, const float* Qt, const float* Kt, size_t H, float* logits) {
  const size_t NL = hn::Lanes(dk);
  for (size_t j = 0; j < kBk; j += 2 * NL) {
    // One 2-D accumulator array (not one array per key vector) keeps GCC
    // from splitting the loop in two, which would broadcast each query
    // element twice.
    hn::Vec<DK> acc[R][2];
    for (size_t r = 0; r < R; ++r) acc[r][0] = acc[r][1] = hn::Zero(dk);
    const float* kt = Kt + j;
    const float* qt = Qt;
    for (size_t h = 0; h < H; ++h, kt += kBk, qt += R) {
      const auto k0 = hn::Load(dk, kt), k1 = hn::Load(dk, kt + NL);
      for (size_t r = 0; r < R; ++r) {
        const auto q = hn::Set(dk, qt[r]);
        acc[r][0] = hn::MulAdd(q, k0, acc[r][0]);
        acc[r][1] = hn::MulAdd(q, k1, acc[r][1]);
      }
    }
    for (size_t r = 0; r < R; ++r) {
      hn::Store(acc[r][0], dk, logits + r * kBk + j);
      hn::Store(acc[r][1], dk, logits + r * kBk + j + NL);
    }
  }
}

// Where row i of the call reads its query and writes its output.
struct RowIO {
  const float* q;
  float* out;
  g3_row_bounds b;
};

template <int kG>
HWY_INLINE RowIO RowAt(const g3_core_args* a, size_t i) {
  const size_t G = kG ? size_t(kG) : size_t(a->group), H = size_t(a->head_dim);
  const size_t t = i / G, g = i % G;
  RowIO io;
  io.q = a->q + int64_t(t) * a->q_stride + int64_t(g * H);
  io.out = a->out + int64_t(t) * a->out_stride + int64_t(g * H);
  io.b = g3_bounds_of(a, int64_t(t));
  return io;
}

// Prefill: blocks of kMacroRows rows; for each key tile that some row of the
// block may see, the tile is widened to f32 and transposed once ([H][kBk]),
// then every register tile of kRows rows runs QK -> softmax -> PV on it.
// kBC: the bf16 compute mode (kernel_contract.h): q, K, p and V rounded to
// bf16 where they are staged for the products; f32 accumulation as ever.
template <int kDH, int kG, int kKV, bool kBC, class D>
HWY_NOINLINE void CorePrefill(D d, const g3_core_args* a, size_t rows, const g3_tile_info* info, size_t ntiles) {
  const hn::ScalableTag<float> dk;
  const size_t H = kDH ? size_t(kDH) : size_t(a->head_dim);
  constexpr size_t R = kRows;
  static thread_local Scratch<float> scratch;
  const size_t nmicro_max = kMacroRows / R;
  // Vf: the value tile when it cannot be read in place (bf16 widened to f32,
  // or invalid slots to be zeroed).
  const size_t off_kt = 0, off_vf = off_kt + H * kBk, off_qt = off_vf + H * kBk;
  const size_t off_o = off_qt + kMacroRows * H, off_logits = off_o + kMacroRows * H, off_m = off_logits + R * kBk;
  const size_t off_l = off_m + kMacroRows, off_c = off_l + kMacroRows, off_kp = off_c + R,
               off_kv = off_kp + kBk, total = off_kv + kBk;
  float* base = scratch.Get(total);
  float* Kt = base + off_kt;
  float* Vf = base + off_vf;
  float* Qt = base + off_qt;
  float* O = base + off_o;
  float* logits = base + off_logits;
  float* m = base + off_m;
  float* l = base + off_l;
  float* corr = base + off_c;
  int32_t* kp = reinterpret_cast<int32_t*>(base + off_kp);
  int32_t* kv = reinterpret_cast<int32_t*>(base + off_kv);

  RowIO io[kMacroRows];
  g3_row_bounds rb[kMacroRows];
  g3_row_set micro[kMacroRows / kRows];
  for (size_t r0 = 0; r0 < rows; r0 += kMacroRows) {
    const size_t nrows = rows - r0 < kMacroRows ? rows - r0 : kMacroRows;
    const size_t nmicro = (nrows + R - 1) / R;
    g3_row_set all = g3_row_set_empty();
    for (size_t u = 0; u < nmicro; ++u) {
      g3_row_set rs = g3_row_set_empty();
      for (size_t r = 0; r < R; ++r) {
        const size_t i = u * R + r;
        float* qt = Qt + u * H * R + r;
        if (i < nrows) {
          io[i] = RowAt<kG>(a, r0 + i);
          rb[i] = io[i].b;
          for (size_t h = 0; h < H; ++h) qt[h * R] = io[i].q[h];
          g3_row_set_add(&rs, rb[i]);
        } else {
          // Padding rows of the last register tile: zero queries that see
          // nothing; computed, never stored.
          rb[i] = g3_bounds_none();
          for (size_t h = 0; h < H; ++h) qt[h * R] = 0.0f;
        }
        m[i] = kNegBig;
        l[i] = 0.0f;
      }
      micro[u] = rs;
      g3_row_set_merge(&all, &rs);
    }
    if constexpr (kBC) bf16::RoundInPlace(d, Qt, nmicro * H * R);
    memset(O, 0, nmicro * R * H * sizeof(float));

    for (size_t k = 0; k < ntiles; ++k) {
      if (g3_classify(&info[k], &all) == G3_TILE_SKIP) continue;
      const size_t s0 = k * kBk;
      const size_t nk = size_t(a->S) - s0 < kBk ? size_t(a->S) - s0 : kBk;
      // Widen and transpose the key tile: Kt[h][s]; slots past S are zero.
      // Blocks of 16 keys: each h then writes one whole cache line of Kt
      // while reading 16 sequential K streams, instead of touching H lines
      // per key.
      for (size_t sb = 0; sb < kBk; sb += 16) {
        const size_t nb = nk > sb ? (nk - sb < 16 ? nk - sb : 16) : 0;
        for (size_t h = 0; h < H; ++h) {
          float* dst = Kt + h * kBk + sb;
          if constexpr (kKV == G3_DTYPE_F32) {
            const float* src = static_cast<const float*>(a->k) + (s0 + sb) * H + h;
            for (size_t s = 0; s < nb; ++s) dst[s] = src[s * H];
          } else {
            const uint16_t* src = static_cast<const uint16_t*>(a->k) + (s0 + sb) * H + h;
            for (size_t s = 0; s < nb; ++s) {
              const uint32_t u32 = uint32_t(src[s * H]) << 16;
              memcpy(dst + s, &u32, 4);
            }
          }
          for (size_t s = nb; s < 16; ++s) dst[s] = 0.0f;
        }
      }
      if constexpr (kBC && kKV == G3_DTYPE_F32) bf16::RoundInPlace(d, Kt, H * kBk);
      // Values: f32 are read in place when every slot is valid (and the
      // compute mode is f32); bf16 are widened once per tile here rather than
      // once per register tile; invalid slots are zeroed either way
      // (CleanValues).
      const float* Vt = static_cast<const float*>(a->v) + s0 * H;
      if constexpr (kKV == G3_DTYPE_BF16) {
        const uint16_t* vb = static_cast<const uint16_t*>(a->v) + s0 * H;
        for (size_t s = 0; s < nk; ++s) {
          const bool ok = a->kvalid[s0 + s] != 0;
          for (size_t h = 0; h < H; h += hn::Lanes(d))
            hn::Store(ok ? LoadKV<G3_DTYPE_BF16>(d, vb, s * H + h) : hn::Zero(d), d, Vf + s * H + h);
        }
        Vt = Vf;
      } else if (kBC) {
        const void* clean = CleanValues<G3_DTYPE_F32>(a, s0, nk, H, Vf);
        if (clean != Vf) memcpy(Vf, clean, nk * H * sizeof(float));
        bf16::RoundInPlace(d, Vf, nk * H);
        Vt = Vf;
      } else if (!info[k].all) {
        Vt = static_cast<const float*>(CleanValues<G3_DTYPE_F32>(a, s0, nk, H, Vf));
      }
      TileMaskData(a, k, kp, kv);
      for (size_t u = 0; u < nmicro; ++u) {
        const int c = g3_classify(&info[k], &micro[u]);
        if (c == G3_TILE_SKIP) continue;
        QKTile<R>(dk, Qt + u * H * R, Kt, H, logits);
        SoftmaxTile(dk, R, kBk, logits, kBk, c == G3_TILE_FULL, int64_t(s0), kp, kv, rb + u * R, m + u * R,
                    l + u * R, corr);
        // The weights enter P.V rounded; l was summed from them unrounded.
        if constexpr (kBC) bf16::RoundInPlace(dk, logits, R * kBk);
        PVTile<R, 2, G3_DTYPE_F32>(d, logits, corr, Vt, nk, H, O + u * R * H);
      }
    }
    for (size_t i = 0; i < nrows; ++i)
      FinishRow(d, O + i * H, m[i], l[i], H, io[i].out, a->lse ? a->lse + (r0 + i) : nullptr);
  }
}

// Decode-sized calls (few rows): logits by dot products straight from the
// cache, then the same online softmax, then P.V. K and V are each read
// exactly once and strictly in address order, key row after key row, which
// is what the hardware prefetcher follows best on a long bandwidth-bound
// stream. Consecutive keys are independent, so out-of-order execution
// overlaps their FMA chains.
template <size_t NR, int kKV, bool kBC, class D>
HWY_INLINE void DecodeLogits(D d, const float* const* q, const void* keys, size_t s0, size_t nk, size_t width,
                             size_t H, float* logits) {
  const size_t NL = hn::Lanes(d);
  for (size_t s = 0; s < nk; ++s) {
    hn::Vec<D> acc[NR][2];
    for (size_t r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = hn::Zero(d);
    size_t h = 0;
    for (; h + 2 * NL <= H; h += 2 * NL) {
      const auto k0 = LoadKV<kKV, kBC>(d, keys, (s0 + s) * H + h);
      const auto k1 = LoadKV<kKV, kBC>(d, keys, (s0 + s) * H + h + NL);
      for (size_t r = 0; r < NR; ++r) {
        acc[r][0] = hn::MulAdd(hn::LoadU(d, q[r] + h), k0, acc[r][0]);
        acc[r][1] = hn::MulAdd(hn::LoadU(d, q[r] + h + NL), k1, acc[r][1]);
      }
    }
    for (; h < H; h += NL) {
      const auto k0 = LoadKV<kKV, kBC>(d, keys, (s0 + s) * H + h);
      for (size_t r = 0; r < NR; ++r) acc[r][0] = hn::MulAdd(hn::LoadU(d, q[r] + h), k0, acc[r][0]);
    }
    for (size_t r = 0; r < NR; ++r) logits[r * kBk + s] = hn::GetLane(hn::SumOfLanes(d, hn::Add(acc[r][0], acc[r][1])));
  }
  for (size_t r = 0; r < NR; ++r)
    for (size_t j = nk; j < width; ++j) logits[r * kBk + j] = 0.0f;  // masked later (invalid padding)
}

// Decode P.V (SPEC 1.3 step I): O[r] = O[r] * corr[r] + sum_s P[r][s] V[s],
// V rows read in order, each once; the NR running outputs (NR x H floats)
// stay in L1.
template <size_t NR, int kKV, bool kBC, class D>
HWY_INLINE void DecodePV(D d, const float* P, const float* corr, const void* V, size_t nk, size_t H, float* O) {
  const size_t NL = hn::Lanes(d);
  for (size_t r = 0; r < NR; ++r) {
    if (corr[r] == 1.0f) continue;
    const auto c = hn::Set(d, corr[r]);
    for (size_t h = 0; h < H; h += NL) hn::StoreU(hn::Mul(hn::LoadU(d, O + r * H + h), c), d, O + r * H + h);
  }
  size_t s = 0;
  // Four keys per pass over O: a quarter of the O loads and stores, and the
  // four V rows are one contiguous stretch of memory.
  for (; s + 4 <= nk; s += 4) {
    hn::Vec<D> p[NR][4];
    for (size_t r = 0; r < NR; ++r)
      for (size_t j = 0; j < 4; ++j) p[r][j] = hn::Set(d, P[r * kBk + s + j]);
    for (size_t h = 0; h < H; h += NL) {
      hn::Vec<D> v[4];
      for (size_t j = 0; j < 4; ++j) v[j] = LoadKV<kKV, kBC>(d, V, (s + j) * H + h);
      for (size_t r = 0; r < NR; ++r) {
        auto o = hn::LoadU(d, O + r * H + h);
        for (size_t j = 0; j < 4; ++j) o = hn::MulAdd(p[r][j], v[j], o);
        hn::StoreU(o, d, O + r * H + h);
      }
    }
  }
  for (; s < nk; ++s) {
    hn::Vec<D> p[NR];
    for (size_t r = 0; r < NR; ++r) p[r] = hn::Set(d, P[r * kBk + s]);
    for (size_t h = 0; h < H; h += NL) {
      const auto v = LoadKV<kKV, kBC>(d, V, s * H + h);
      for (size_t r = 0; r < NR; ++r) hn::StoreU(hn::MulAdd(p[r], v, hn::LoadU(d, O + r * H + h)), d, O + r * H + h);
    }
  }
}

template <size_t NR, int kDH, int kG, int kKV, bool kBC, class D>
HWY_NOINLINE void CoreDecodeGroup(D d, const g3_core_args* a, size_t row0, const g3_tile_info* info,
                                  size_t ntiles) {
  const hn::ScalableTag<float> dk;
  const size_t H = kDH ? size_t(kDH) : size_t(a->head_dim);
  static thread_local Scratch<float> scratch;
  constexpr size_t kDk = 16;  // keys per sub-block (below); a multiple of every target's lane count
  float* O = scratch.Get(NR * H + NR * kBk + 2 * kBk + kDk * H + (kBC ? NR * H : 0));
  float* logits = O + NR * H;
  int32_t* kp = reinterpret_cast<int32_t*>(logits + NR * kBk);
  int32_t* kv = kp + kBk;
  float* Vclean = reinterpret_cast<float*>(kv + kBk);
  float* qround = Vclean + kDk * H;  // kBC: the rows' queries rounded to bf16
  RowIO io[NR];
  g3_row_bounds rb[NR];
  const float* q[NR];
  float m[NR], l[NR], corr[NR];
  g3_row_set rs = g3_row_set_empty();
  for (size_t r = 0; r < NR; ++r) {
    io[r] = RowAt<kG>(a, row0 + r);
    rb[r] = io[r].b;
    q[r] = io[r].q;
    if constexpr (kBC) {
      memcpy(qround + r * H, io[r].q, H * sizeof(float));
      bf16::RoundInPlace(d, qround + r * H, H);
      q[r] = qround + r * H;
    }
    m[r] = kNegBig;
    l[r] = 0.0f;
    g3_row_set_add(&rs, rb[r]);
  }
  memset(O, 0, NR * H * sizeof(float));
  // Tiles are classified as in prefill, then streamed in sub-blocks of kDk
  // keys: a sub-block's K and V rows (2 x kDk x H elements) stay in L1
  // between the logits and P.V, so each is read from memory exactly once.
  for (size_t k = 0; k < ntiles; ++k) {
    const int c = g3_classify(&info[k], &rs);
    if (c == G3_TILE_SKIP) continue;
    if (c != G3_TILE_FULL) TileMaskData(a, k, kp, kv);
    const size_t t0 = k * kBk;
    const size_t nt = size_t(a->S) - t0 < kBk ? size_t(a->S) - t0 : kBk;
    for (size_t b = 0; b < nt; b += kDk) {
      const size_t s0 = t0 + b, nk = nt - b < kDk ? nt - b : kDk;
      // Ask for the K and V rows kPf keys ahead explicitly as well (slots
      // are contiguous per KV head, so these are two sequential byte ranges):
      // one thread's demand misses alone do not keep enough reads in flight.
      constexpr size_t kPf = 48;
      if (s0 + kPf < size_t(a->S)) {
        const size_t esz = kKV == G3_DTYPE_F32 ? 4 : 2;
        const size_t n = (size_t(a->S) - s0 - kPf < kDk ? size_t(a->S) - s0 - kPf : kDk) * H * esz;
        const uint8_t* kb = static_cast<const uint8_t*>(a->k) + (s0 + kPf) * H * esz;
        const uint8_t* vb = static_cast<const uint8_t*>(a->v) + (s0 + kPf) * H * esz;
        for (size_t off = 0; off < n; off += 64) {
          hwy::Prefetch(kb + off);
          hwy::Prefetch(vb + off);
        }
      }
      DecodeLogits<NR, kKV, kBC>(d, q, a->k, s0, nk, kDk, H, logits);
      SoftmaxTile(dk, NR, kDk, logits, kBk, c == G3_TILE_FULL, int64_t(s0), kp + b, kv + b, rb, m, l, corr);
      if constexpr (kBC)
        for (size_t r = 0; r < NR; ++r) bf16::RoundInPlace(dk, logits + r * kBk, kDk);
      const void* V = info[k].all ? static_cast<const void*>(static_cast<const uint8_t*>(a->v) +
                                                             s0 * H * (kKV == G3_DTYPE_F32 ? 4 : 2))
                                  : CleanValues<kKV>(a, s0, nk, H, Vclean);
      DecodePV<NR, kKV, kBC>(d, logits, corr, V, nk, H, O);
    }
  }
  for (size_t r = 0; r < NR; ++r)
    FinishRow(d, O + r * H, m[r], l[r], H, io[r].out, a->lse ? a->lse + (row0 + r) : nullptr);
}

template <int kDH, int kG, int kKV, bool kBC, class D>
HWY_INLINE void CoreDecode(D d, const g3_core_args* a, size_t rows, const g3_tile_info* info, size_t ntiles) {
  size_t r = 0;
  for (; r + 4 <= rows; r += 4) CoreDecodeGroup<4, kDH, kG, kKV, kBC>(d, a, r, info, ntiles);
  switch (rows - r) {
    case 3: CoreDecodeGroup<3, kDH, kG, kKV, kBC>(d, a, r, info, ntiles); break;
    case 2: CoreDecodeGroup<2, kDH, kG, kKV, kBC>(d, a, r, info, ntiles); break;
    case 1: CoreDecodeGroup<1, kDH, kG, kKV, kBC>(d, a, r, info, ntiles); break;
    default: break;
  }
}

template <int kDH, int kG, int kKV, bool kBC, class D>
HWY_NOINLINE void CoreImpl(D d, const g3_core_args* a) {
  const size_t G = kG ? size_t(kG) : size_t(a->group);
  const size_t rows = size_t(a->T) * G;
  if (rows == 0) return;
  if (a->S <= 0) {  // nothing to attend to: every row is a no-key row
    for (size_t i = 0; i < rows; ++i) {
      const RowIO io = RowAt<kG>(a, i);
      FinishRow(d, io.q, 0.0f, 0.0f, size_t(a->head_dim), io.out, a->lse ? a->lse + i : nullptr);
    }
    return;
  }
  static thread_local Scratch<float> scratch;
  const size_t ntiles = (size_t(a->S) + kBk - 1) / kBk;
  g3_tile_info* info =
      reinterpret_cast<g3_tile_info*>(scratch.Get(ntiles * (sizeof(g3_tile_info) / sizeof(float) + 1)));
  for (size_t k = 0; k < ntiles; ++k) info[k] = g3_tile_info_of(a, int64_t(k * kBk), int64_t(kBk));
  if (rows <= kDecodeRows) {
    CoreDecode<kDH, kG, kKV, kBC>(d, a, rows, info, ntiles);
  } else {
    CorePrefill<kDH, kG, kKV, kBC>(d, a, rows, info, ntiles);
  }
}

// Entry for the per-key instances. kDH: 0 = runtime head_dim; kG: 0 =
// runtime group; kKV: -1 = runtime KV dtype; kCompute: -1 = runtime compute
// mode (G3_COMPUTE_F32 / G3_COMPUTE_BF16). The window is always read from
// the args: it only enters tile classification and mask bounds, where a
// constant buys nothing.
template <int kDH, int kG, int kKV, int kCompute>
HWY_INLINE void Core(const g3_core_args* a) {
  if constexpr (kKV < 0) {
    if (a->kv_dtype == G3_DTYPE_BF16) {
      Core<kDH, kG, G3_DTYPE_BF16, kCompute>(a);
    } else {
      Core<kDH, kG, G3_DTYPE_F32, kCompute>(a);
    }
  } else if constexpr (kCompute < 0) {
    if (a->compute == G3_COMPUTE_BF16) {
      Core<kDH, kG, kKV, G3_COMPUTE_BF16>(a);
    } else {
      Core<kDH, kG, kKV, G3_COMPUTE_F32>(a);
    }
  } else {
    constexpr bool kBC = kCompute == G3_COMPUTE_BF16;
    const hn::ScalableTag<float> df;
    if constexpr (kDH != 0 && size_t(kDH) % hn::MaxLanes(df) == 0) {
      CoreImpl<kDH, kG, kKV, kBC>(df, a);
    } else {
      const size_t H = kDH ? size_t(kDH) : size_t(a->head_dim);
      if (H % hn::Lanes(df) == 0) {
        CoreImpl<kDH, kG, kKV, kBC>(df, a);
      } else {
        CoreImpl<kDH, kG, kKV, kBC>(hn::CappedTag<float, 1>(), a);
      }
    }
  }
}

}  // namespace attn
}  // namespace HWY_NAMESPACE
}  // namespace g3
HWY_AFTER_NAMESPACE();

#endif  // G3_ATTENTION_INL_H_
