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

#include <type_traits>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "bf16-inl.h"
#include "decode_prefetch.h"
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
using flash::FinishRowStrided;
using flash::kNegBig;
using flash::SoftmaxTile;
using flash::SoftmaxTileT;

// Keys per tile of the decode core. The structured mask is summarised per
// tile (min/max stored position of its valid slots), which is what lets the
// cores skip tiles that the causal or window rule hides from a block of rows.
constexpr size_t kBk = 64;
// Query rows (token x group head) per block of the prefill core: large enough
// that each K/V tile is reused by many rows while it sits in L2; small enough
// that the block's staged queries and running outputs stay in L2 too.
constexpr size_t kMacroRows = 128;
// Up to this many rows, the core streams K/V row by row (decode) instead of
// running micro tiles of query rows: a tile only pays off when many rows use
// each key.
constexpr size_t kDecodeRows = 8;
// The prefill core's register tiles (see QKTileT and PVTileT): a micro tile
// is kRowVecs vectors of query rows; QK takes kKR keys and PV kHB head
// elements against it at a time, kRowVecs x kKR (kHB) accumulators: 16 of
// the 32 vector registers of AVX-512, 8 of the 16 of SSE/AVX2.
constexpr size_t kRowVecs = 2;
#if HWY_TARGET <= HWY_AVX3
constexpr size_t kKR = 8, kHB = 8;
#else
constexpr size_t kKR = 4, kHB = 4;
#endif
// Keys per tile of the prefill core: each micro tile rescales its running
// outputs once per tile, so a longer tile amortises that over more keys.
constexpr size_t kPk = 128;
// Keys per sub-tile: the grain at which the prefill core cuts a tile to the
// keys a micro tile's rows may see (the causal diagonal, the window's edges)
// and decides where elements must be masked.
constexpr size_t kSub = 16;
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

// cos and sin of one token's RoPE angles (SPEC 2.2), theta_i = pos / ts_i /
// sigma with timescale_i = base^(2i/H), in double as the reference computes
// them and rounded to f32 after cos/sin. Memoised per thread for the last
// position of each of the last two (base, sigma, H): a decode step asks for
// one position in every layer and Gemma 3 has two kinds of layer, so each
// kind computes its angles once per step instead of once per layer (pow,
// cos and sin of H/2 angles in double are a few microseconds, and the QK
// stage of a decode step runs on one thread while the others wait).
struct RopeAngles {
  double base = 0, rscale = 0;
  size_t H = 0;
  bool has_pos = false;
  int32_t pos = 0;
  double ts[512];  // H <= 1024 by config validation, so H/2 <= 512
  float cs[512], sn[512];
};

HWY_INLINE const RopeAngles& RopeAt(double base, double rscale, size_t H, int32_t pos) {
  static thread_local RopeAngles memo[2];
  static thread_local unsigned newest = 0;
  const size_t half = H / 2;
  RopeAngles* r = nullptr;
  for (RopeAngles& m : memo)
    if (m.H == H && m.base == base && m.rscale == rscale) r = &m;
  if (!r) {
    newest ^= 1;
    r = &memo[newest];
    r->base = base;
    r->rscale = rscale;
    r->H = H;
    r->has_pos = false;
    for (size_t i = 0; i < half; ++i) r->ts[i] = pow(base, 2.0 * double(i) / double(H));
  }
  if (!r->has_pos || r->pos != pos) {
    for (size_t i = 0; i < half; ++i) {
      const double th = double(pos) / r->ts[i] / rscale;
      r->cs[i] = static_cast<float>(cos(th));
      r->sn[i] = static_cast<float>(sin(th));
    }
    r->pos = pos;
    r->has_pos = true;
  }
  return *r;
}

// The whole QK stage for one call. kDH: head_dim or 0 (runtime).
template <int kDH, int kKV, class D>
HWY_NOINLINE void QkImpl(D d, const g3_qk_args* a, double base, double rscale, float alpha) {
  const size_t H = kDH ? size_t(kDH) : size_t(a->head_dim), NL = hn::Lanes(d);
  static thread_local Scratch<float> scratch;
  float* tmp = scratch.Get(RoundUp(H, 16));
  for (int64_t t = 0; t < a->T; ++t) {
    // The angles once per token, shared by every head.
    const RopeAngles& ra = RopeAt(base, rscale, H, a->pos[t]);
    for (int32_t n = 0; n < a->num_heads; ++n) {
      NormRope(d, a->q + t * a->q_stride + n * int64_t(H), a->q_norm, a->eps, ra.cs, ra.sn, H, alpha,
               a->q_out + t * a->q_out_stride + n * int64_t(H));
    }
    const int64_t slot = a->slot[t];
    if (slot < 0) continue;
    for (int32_t j = 0; j < a->num_kv_heads; ++j) {
      const size_t dst = size_t((j * a->cache_head_stride + slot) * int64_t(H));
      // Keys are normed and rotated but never scaled (SPEC 1.3 step C).
      NormRope(d, a->k + t * a->kv_stride + j * int64_t(H), a->k_norm, a->eps, ra.cs, ra.sn, H, 1.0f, tmp);
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
// on the slot; per tile of slots (kBk in decode, kSub-slot sub-tiles in
// prefill), a summary that classifies the whole tile against a set of rows.

// Positions and validity of the `width` slots from s0 as int32 lanes, padded
// past S with invalid slots so vector code may always run over whole tiles.
HWY_INLINE void TileMaskData(const g3_core_args* a, size_t s0, size_t width, int32_t* kp, int32_t* kv) {
  for (size_t i = 0; i < width; ++i) {
    const int64_t s = int64_t(s0 + i);
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

// The prefill core works with query rows in vector lanes: a micro tile is
// kRowVecs vectors of rows (MR = kRowVecs x NL rows), its queries staged
// transposed (Qt[h][MR]), its logits computed as S^T = K Q^T (Lt[key][MR])
// and its output accumulated as O^T (Ot[h][MR]). K and V are then read in
// their cache layout, one scalar broadcast per element, so no key tile is
// ever transposed; the online softmax runs down the keys with one lane per
// row (no horizontal reductions); and key ranges can be cut at any key, not
// only at tile edges. Each product keeps 2 x kKR (or 2 x kHB) accumulators
// and loads kKR + 2 (kHB + 2) operands per 2 x kKR FMAs.

// Lt[j][r] = sum_h K[j][h] Qt[h][r] for keys j < nk (SPEC 1.3 step E): kKR
// keys by MR rows per register tile, K rows read in place (row stride H).
template <size_t kKR, class DK>
HWY_INLINE void QKTileT(DK dk, const float* HWY_RESTRICT Qt, const float* HWY_RESTRICT K, size_t nk, size_t H,
                        float* HWY_RESTRICT Lt) {
  const size_t NL = hn::Lanes(dk), MR = kRowVecs * NL;
  size_t j = 0;
  auto block = [&](auto kr_tag) HWY_ATTR {
    constexpr size_t KR = decltype(kr_tag)::value;
    hn::Vec<DK> acc[KR][kRowVecs];
    for (size_t i = 0; i < KR; ++i)
      for (size_t v = 0; v < kRowVecs; ++v) acc[i][v] = hn::Zero(dk);
    const float* kr = K + j * H;
    const float* qt = Qt;
    for (size_t h = 0; h < H; ++h, qt += MR) {
      hn::Vec<DK> q[kRowVecs];
      for (size_t v = 0; v < kRowVecs; ++v) q[v] = hn::Load(dk, qt + v * NL);
      for (size_t i = 0; i < KR; ++i) {
        const auto k = hn::Set(dk, kr[i * H + h]);
        for (size_t v = 0; v < kRowVecs; ++v) acc[i][v] = hn::MulAdd(k, q[v], acc[i][v]);
      }
    }
    for (size_t i = 0; i < KR; ++i)
      for (size_t v = 0; v < kRowVecs; ++v) hn::Store(acc[i][v], dk, Lt + (j + i) * MR + v * NL);
  };
  for (; j + kKR <= nk; j += kKR) block(std::integral_constant<size_t, kKR>());
  for (; j < nk; ++j) block(std::integral_constant<size_t, 1>());
}

// Ot[h][r] = Ot[h][r] * corr[r] + sum_{j < nk} V[j][h] Pt[j][r] (SPEC 1.3
// step I): kHB head elements by MR rows per register tile, V rows read in
// place (row stride H). The rescale by corr is folded into loading the
// accumulators.
template <size_t kHB, class DK>
HWY_INLINE void PVTileT(DK dk, const float* HWY_RESTRICT Pt, const float* HWY_RESTRICT corr,
                        const float* HWY_RESTRICT V, size_t nk, size_t H, float* HWY_RESTRICT Ot) {
  const size_t NL = hn::Lanes(dk), MR = kRowVecs * NL;
  hn::Vec<DK> c[kRowVecs];
  for (size_t v = 0; v < kRowVecs; ++v) c[v] = hn::Load(dk, corr + v * NL);
  size_t h = 0;
  auto block = [&](auto hb_tag) HWY_ATTR {
    constexpr size_t HB = decltype(hb_tag)::value;
    hn::Vec<DK> acc[HB][kRowVecs];
    for (size_t i = 0; i < HB; ++i)
      for (size_t v = 0; v < kRowVecs; ++v) acc[i][v] = hn::Mul(hn::Load(dk, Ot + (h + i) * MR + v * NL), c[v]);
    const float* vr = V + h;
    const float* pt = Pt;
    for (size_t j = 0; j < nk; ++j, vr += H, pt += MR) {
      hn::Vec<DK> p[kRowVecs];
      for (size_t v = 0; v < kRowVecs; ++v) p[v] = hn::Load(dk, pt + v * NL);
      for (size_t i = 0; i < HB; ++i) {
        const auto x = hn::Set(dk, vr[i]);
        for (size_t v = 0; v < kRowVecs; ++v) acc[i][v] = hn::MulAdd(x, p[v], acc[i][v]);
      }
    }
    for (size_t i = 0; i < HB; ++i)
      for (size_t v = 0; v < kRowVecs; ++v) hn::Store(acc[i][v], dk, Ot + (h + i) * MR + v * NL);
  };
  for (; h + kHB <= H; h += kHB) block(std::integral_constant<size_t, kHB>());
  for (; h < H; ++h) block(std::integral_constant<size_t, 1>());
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

// Keys [s0, s0 + nk) as f32 rows in `dst` (nk x H): bf16 widened, and in
// the bf16 compute mode rounded to bf16 as the products see them; invalid
// slots zeroed when `zero_invalid` (for V: their weights are exactly 0, but
// 0 * NaN is NaN and an invalid slot may hold anything).
template <int kKV, bool kBC, class D>
HWY_INLINE void StageKeys(D d, const g3_core_args* a, const void* src, size_t s0, size_t nk, size_t H,
                          bool zero_invalid, float* dst) {
  for (size_t s = 0; s < nk; ++s) {
    float* row = dst + s * H;
    if (zero_invalid && !a->kvalid[s0 + s]) {
      memset(row, 0, H * sizeof(float));
      continue;
    }
    if constexpr (kKV == G3_DTYPE_F32) {
      memcpy(row, static_cast<const float*>(src) + (s0 + s) * H, H * sizeof(float));
      if constexpr (kBC) bf16::RoundInPlace(d, row, H);
    } else {
      for (size_t h = 0; h < H; h += hn::Lanes(d))
        hn::Store(LoadKV<G3_DTYPE_BF16>(d, src, (s0 + s) * H + h), d, row + h);
    }
  }
}

// Prefill: blocks of kMacroRows rows, each staged as micro tiles of MR rows
// (queries transposed, bf16-rounded in the bf16 compute mode). For each
// tile of kPk keys that some row of the block may see, every micro tile
// takes the keys its rows may see, cut to kSub-key sub-tiles (the mask rule
// classifies each sub-tile against the micro tile's rows; only the partial
// ones are masked element by element), and runs QK -> softmax -> PV on
// them. K and V are read in place where they are f32 and the tile is clean;
// otherwise the tile is staged once (StageKeys) for every micro tile of the
// block. kBC: the bf16 compute mode (kernel_contract.h): q, K, p and V
// rounded to bf16; f32 accumulation as ever.
template <int kDH, int kG, int kKV, bool kBC, class D>
HWY_NOINLINE void CorePrefill(D d, const g3_core_args* a, size_t rows) {
  const hn::ScalableTag<float> dk;
  const size_t H = kDH ? size_t(kDH) : size_t(a->head_dim);
  const size_t NL = hn::Lanes(dk), MR = kRowVecs * NL;
  constexpr size_t kSubs = kPk / kSub;
  static_assert(kPk % kSub == 0 && kSubs <= 32, "sub-tiles divide a tile, one bit each");
  const size_t S = size_t(a->S), ntiles = (S + kPk - 1) / kPk, nsub = (S + kSub - 1) / kSub;
  // Scratch, in floats: Kf, Vf (staged key tiles), Qt and Ot (per micro
  // tile H x MR), Lt (one micro tile's logits), per-row m, l, corr and
  // bounds, the tile's positions and validity, and the sub-tile summaries.
  static thread_local Scratch<float> scratch;
  const size_t info_floats = (nsub + ntiles) * (sizeof(g3_tile_info) / sizeof(float) + 1);
  const size_t off_kf = 0, off_vf = off_kf + kPk * H, off_qt = off_vf + kPk * H, off_ot = off_qt + kMacroRows * H,
               off_lt = off_ot + kMacroRows * H, off_m = off_lt + kPk * MR, off_l = off_m + kMacroRows,
               off_c = off_l + kMacroRows, off_lo = off_c + MR, off_hi = off_lo + kMacroRows,
               off_last = off_hi + kMacroRows, off_kp = off_last + MR, off_kv = off_kp + kPk,
               off_info = off_kv + kPk, total = off_info + info_floats;
  float* base = scratch.Get(total);
  float* Kf = base + off_kf;
  float* Vf = base + off_vf;
  float* Qt = base + off_qt;
  float* Ot = base + off_ot;
  float* Lt = base + off_lt;
  float* m = base + off_m;
  float* l = base + off_l;
  float* corr = base + off_c;
  int32_t* lo = reinterpret_cast<int32_t*>(base + off_lo);
  int32_t* hi = reinterpret_cast<int32_t*>(base + off_hi);
  int32_t* last = reinterpret_cast<int32_t*>(base + off_last);
  int32_t* kp = reinterpret_cast<int32_t*>(base + off_kp);
  int32_t* kv = reinterpret_cast<int32_t*>(base + off_kv);
  g3_tile_info* sub = reinterpret_cast<g3_tile_info*>(base + off_info);
  g3_tile_info* tile = sub + nsub;
  for (size_t k = 0; k < nsub; ++k) sub[k] = g3_tile_info_of(a, int64_t(k * kSub), int64_t(kSub));
  for (size_t k = 0; k < ntiles; ++k) {
    tile[k] = sub[k * kSubs];
    for (size_t j = 1; j < kSubs && k * kSubs + j < nsub; ++j) g3_tile_info_merge(&tile[k], &sub[k * kSubs + j]);
    tile[k].all = tile[k].all && tile[k].s1 - tile[k].s0 == int64_t(kPk);
  }

  RowIO io[kMacroRows];
  g3_row_set micro[kMacroRows / kRowVecs];  // per micro tile
  for (size_t r0 = 0; r0 < rows; r0 += kMacroRows) {
    const size_t nrows = rows - r0 < kMacroRows ? rows - r0 : kMacroRows;
    const size_t nmicro = (nrows + MR - 1) / MR;
    g3_row_set all = g3_row_set_empty();
    for (size_t u = 0; u < nmicro; ++u) {
      g3_row_set rs = g3_row_set_empty();
      float* qt = Qt + u * H * MR;
      for (size_t r = 0; r < MR; ++r) {
        const size_t i = u * MR + r;
        g3_row_bounds b = g3_bounds_none();
        if (i < nrows) {
          io[i] = RowAt<kG>(a, r0 + i);
          b = io[i].b;
          for (size_t h = 0; h < H; ++h) qt[h * MR + r] = io[i].q[h];
          g3_row_set_add(&rs, b);
        } else {
          // Padding rows of the last micro tile: zero queries that see
          // nothing; computed, never stored.
          for (size_t h = 0; h < H; ++h) qt[h * MR + r] = 0.0f;
        }
        lo[i] = b.lo;
        hi[i] = b.hi;
        m[i] = kNegBig;
        l[i] = 0.0f;
      }
      micro[u] = rs;
      g3_row_set_merge(&all, &rs);
    }
    if constexpr (kBC) bf16::RoundInPlace(dk, Qt, nmicro * H * MR);
    memset(Ot, 0, nmicro * H * MR * sizeof(float));

    for (size_t k = 0; k < ntiles; ++k) {
      if (g3_classify(&tile[k], &all) == G3_TILE_SKIP) continue;
      const size_t s0 = k * kPk, nk = S - s0 < kPk ? S - s0 : kPk;
      // K and V as the products read them: in place, or staged once here.
      const float* Kt = static_cast<const float*>(a->k) + s0 * H;
      const float* Vt = static_cast<const float*>(a->v) + s0 * H;
      if (kKV == G3_DTYPE_BF16 || kBC) {
        StageKeys<kKV, kBC>(d, a, a->k, s0, nk, H, false, Kf);
        Kt = Kf;
      }
      if (kKV == G3_DTYPE_BF16 || kBC || !tile[k].all) {
        StageKeys<kKV, kBC>(d, a, a->v, s0, nk, H, !tile[k].all, Vf);
        Vt = Vf;
      }
      bool mask_data = false;
      for (size_t u = 0; u < nmicro; ++u) {
        // The micro tile's keys: from its first to its last sub-tile that
        // is not hidden from all of its rows; the sub-tiles in between that
        // are not visible to all of them in full are masked.
        int cls[kSubs];
        size_t j0 = kSubs, j1 = 0;
        for (size_t j = 0; j < kSubs; ++j) {
          cls[j] = k * kSubs + j < nsub ? g3_classify(&sub[k * kSubs + j], &micro[u]) : G3_TILE_SKIP;
          if (cls[j] == G3_TILE_SKIP) continue;
          if (j0 == kSubs) j0 = j;
          j1 = j + 1;
        }
        if (j0 == kSubs) continue;
        uint32_t masked = 0;
        for (size_t j = j0; j < j1; ++j)
          if (cls[j] != G3_TILE_FULL) masked |= 1u << (j - j0);
        const size_t ks = j0 * kSub, ke = j1 * kSub < nk ? j1 * kSub : nk, n = ke - ks;
        if (masked) {
          if (!mask_data) {
            TileMaskData(a, s0, kPk, kp, kv);
            mask_data = true;
          }
          for (size_t r = 0; r < MR; ++r) {
            const size_t i = u * MR + r;
            const g3_row_bounds b = i < nrows ? io[i].b : g3_bounds_none();
            last[r] = int32_t(g3_slot_limit(b, int64_t(s0 + ks), int64_t(n)) - 1);
          }
        }
        const size_t q = u * MR;
        QKTileT<kKR>(dk, Qt + u * H * MR, Kt + ks * H, n, H, Lt);
        SoftmaxTileT(dk, kRowVecs, n, Lt, MR, masked, kSub, kp + ks, kv + ks, lo + q, hi + q, last, m + q, l + q,
                     corr);
        // The weights enter P.V rounded; l was summed from them unrounded.
        if constexpr (kBC) bf16::RoundInPlace(dk, Lt, n * MR);
        PVTileT<kHB>(dk, Lt, corr, Vt + ks * H, n, H, Ot + u * H * MR);
      }
    }
    // Row i's output is column i % MR of its micro tile's O^T.
    for (size_t i = 0; i < nrows; ++i)
      FinishRowStrided(Ot + (i / MR) * H * MR + i % MR, MR, m[i], l[i], H, io[i].out,
                       a->lse ? a->lse + (r0 + i) : nullptr);
  }
}

// Asks for the bytes [from, to) of p, line by line, into L2 (prefetcht1)
// or L1 (prefetcht0).
HWY_INLINE void PrefetchLines(const uint8_t* p, size_t from, size_t to, bool l2) {
  if (l2)
    for (size_t off = from; off < to; off += 64) __builtin_prefetch(p + off, 0, 2);
  else
    for (size_t off = from; off < to; off += 64) __builtin_prefetch(p + off, 0, 3);
}

// Decode-sized calls (few rows): logits by dot products straight from the
// cache, then the same online softmax, then P.V. K and V are each read
// exactly once and strictly in address order, key row after key row, which
// is what the hardware prefetcher follows best on a long bandwidth-bound
// stream. Consecutive keys are independent, so out-of-order execution
// overlaps their FMA chains. Per key, the K row pf_keys ahead is asked for,
// and the V row as well when pf_v is given (else DecodePV asks for it):
// spread out like this the prefetches never queue behind each other.
template <size_t NR, int kKV, bool kBC, class D>
HWY_INLINE void DecodeLogits(D d, const float* const* q, const void* keys, size_t s0, size_t nk, size_t width,
                             size_t H, float* logits, const uint8_t* pf_k, const uint8_t* pf_v, size_t pf_keys,
                             bool pf_l2) {
  const size_t NL = hn::Lanes(d);
  const size_t row_bytes = H * (kKV == G3_DTYPE_F32 ? 4 : 2);
  for (size_t s = 0; s < nk; ++s) {
    if (s < pf_keys) {
      PrefetchLines(pf_k + s * row_bytes, 0, row_bytes, pf_l2);
      if (pf_v) PrefetchLines(pf_v + s * row_bytes, 0, row_bytes, pf_l2);
    }
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
// stay in L1. With pf_v, the V rows pf_keys ahead of the ones read are asked
// for a few lines per step of the loop over h, so the requests run evenly
// through P.V as K's do through the logits.
template <size_t NR, int kKV, bool kBC, class D>
HWY_INLINE void DecodePV(D d, const float* P, const float* corr, const void* V, size_t nk, size_t H, float* O,
                         const uint8_t* pf_v, size_t pf_keys, bool pf_l2) {
  const size_t NL = hn::Lanes(d);
  const size_t row_bytes = H * (kKV == G3_DTYPE_F32 ? 4 : 2);
  // The V bytes to ask for while keys s..s+n-1 are read, and how many of
  // them per step over h (whole lines), worked out once per key group; the
  // request in the loop over h stays written out there: a lambda called per
  // step was not inlined and spilled the loop's vectors around each call
  // (one thread streamed 10-14 GB/s against 17.5-21.6, AMD EPYC Zen 4).
  auto ahead = [&](size_t s, size_t n, size_t& bytes, size_t& per_step) {
    bytes = pf_v && s < pf_keys ? ((s + n < pf_keys ? s + n : pf_keys) - s) * row_bytes : 0;
    const size_t steps = (H + NL - 1) / NL, lines = (bytes + 63) / 64;
    per_step = (lines + steps - 1) / steps * 64;
  };
  for (size_t r = 0; r < NR; ++r) {
    if (corr[r] == 1.0f) continue;
    const auto c = hn::Set(d, corr[r]);
    for (size_t h = 0; h < H; h += NL) hn::StoreU(hn::Mul(hn::LoadU(d, O + r * H + h), c), d, O + r * H + h);
  }
  size_t s = 0;
  // Four keys per pass over O: a quarter of the O loads and stores, and the
  // four V rows are one contiguous stretch of memory.
  for (; s + 4 <= nk; s += 4) {
    size_t pf_bytes, per;
    ahead(s, 4, pf_bytes, per);
    hn::Vec<D> p[NR][4];
    for (size_t r = 0; r < NR; ++r)
      for (size_t j = 0; j < 4; ++j) p[r][j] = hn::Set(d, P[r * kBk + s + j]);
    for (size_t h = 0, at = 0; h < H; h += NL, at += per) {
      if (at < pf_bytes) PrefetchLines(pf_v + s * row_bytes, at, at + per < pf_bytes ? at + per : pf_bytes, pf_l2);
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
    size_t pf_bytes, per;
    ahead(s, 1, pf_bytes, per);
    hn::Vec<D> p[NR];
    for (size_t r = 0; r < NR; ++r) p[r] = hn::Set(d, P[r * kBk + s]);
    for (size_t h = 0, at = 0; h < H; h += NL, at += per) {
      if (at < pf_bytes) PrefetchLines(pf_v + s * row_bytes, at, at + per < pf_bytes ? at + per : pf_bytes, pf_l2);
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
  // Keys per sub-block (below); a multiple of every target's lane count.
  // A whole tile: one softmax step and one rescale of O per 64 keys instead
  // of per 16. Against 16 (AMD EPYC Zen 4, `bench --phase decode --model
  // 1b,4b --context 4096,32768 --kv-dtype f32,bf16 --backend highway,xbyak`,
  // old and new binaries alternating, Highway's time over Xbyak's in the
  // same bench, 3-4 rounds): 8 KiB into L1 (the default) 0.89-1.10 against
  // 0.98-1.21, lower on 14 of 16 rows; 16 KiB into L2 0.94-1.13 against
  // 0.98-1.07 under avx3_dl, 0.81-1.02 against 0.91-1.03 under avx2.
  constexpr size_t kDk = 64;
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
  // How far ahead the sub-blocks below prefetch (pf keys), and into which
  // level: the caller's hint, else decode_prefetch.h's default.
  const size_t esz = kKV == G3_DTYPE_F32 ? 4 : 2;
  const size_t pf = g3_decode_prefetch_keys(H, esz, a->prefetch_bytes);
  const bool pf_l2 = a->prefetch_level == G3_PREFETCH_L2;
  // Tiles are classified as in prefill, then streamed in sub-blocks of kDk
  // keys: logits, softmax step, P.V; each K and V row is read from memory
  // exactly once.
  for (size_t k = 0; k < ntiles; ++k) {
    const int c = g3_classify(&info[k], &rs);
    if (c == G3_TILE_SKIP) continue;
    if (c != G3_TILE_FULL) TileMaskData(a, k * kBk, kBk, kp, kv);
    const size_t t0 = k * kBk;
    const size_t nt = size_t(a->S) - t0 < kBk ? size_t(a->S) - t0 : kBk;
    for (size_t b = 0; b < nt; b += kDk) {
      const size_t s0 = t0 + b, nk = nt - b < kDk ? nt - b : kDk;
      // Ask for the K and V rows pf keys ahead explicitly as well (slots
      // are contiguous per KV head, so these are two sequential byte ranges):
      // one thread's demand misses alone do not keep enough reads in flight.
      // DecodeLogits issues them one key row at a time between its loads: a
      // burst of a whole sub-block's lines (512 for f32 at head_dim 256)
      // queued behind the miss buffers and stalled the loop (AMD EPYC Zen 5,
      // 2 threads, bench --phase block --new-tokens 1 --context 2048, 4B:
      // local 0.755-0.830 ms against 0.855-0.917, global 1.05-1.10 against
      // 1.17-1.20, 3 alternations).
      //
      // Into L2, K's rows are asked for in the logits and V's in P.V, a few
      // lines per step over h (DecodePV), so the requests run through the
      // whole sub-block instead of its first half; into L1 (the default)
      // both stay in the logits, as measured on the Zen 5. On an AMD EPYC
      // Zen 4, 32 KiB ahead (its profile's choice): one thread streaming
      // 65536 keys from DRAM through the core read 17.7-24.1 GB/s of K/V
      // against 12.4-16.5 with both asked for in the logits (1B's and 4B's
      // global keys, f32 and bf16 K/V); two threads, `bench --phase decode
      // --model 1b,4b --context 4096,32768 --kv-dtype f32,bf16 --backend
      // highway --isa best --repeat 20` toggling the two run by run (the
      // neighbour layer with them): 0.71-0.96x the time on 28 of 32 rows,
      // 0.97-1.04x on 1B's local bf16 ones, two benches. V's rows asked for
      // four at once at the top of each P.V step had not helped (88faff4).
      const size_t ahead = s0 + pf < size_t(a->S) ? size_t(a->S) - s0 - pf : 0;
      const size_t pf_keys = ahead < nk ? ahead : nk;
      const uint8_t* kb = pf_keys ? static_cast<const uint8_t*>(a->k) + (s0 + pf) * H * esz : nullptr;
      const uint8_t* vb = pf_keys ? static_cast<const uint8_t*>(a->v) + (s0 + pf) * H * esz : nullptr;
      DecodeLogits<NR, kKV, kBC>(d, q, a->k, s0, nk, kDk, H, logits, kb, pf_l2 ? nullptr : vb, pf_keys, pf_l2);
      SoftmaxTile(dk, NR, kDk, logits, kBk, c == G3_TILE_FULL, int64_t(s0), kp + b, kv + b, rb, m, l, corr);
      if constexpr (kBC)
        for (size_t r = 0; r < NR; ++r) bf16::RoundInPlace(dk, logits + r * kBk, kDk);
      const void* V = info[k].all ? static_cast<const void*>(static_cast<const uint8_t*>(a->v) +
                                                             s0 * H * esz)
                                  : CleanValues<kKV>(a, s0, nk, H, Vclean);
      DecodePV<NR, kKV, kBC>(d, logits, corr, V, nk, H, O, pf_l2 ? vb : nullptr, pf_keys, pf_l2);
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
  if (rows > kDecodeRows) {
    CorePrefill<kDH, kG, kKV, kBC>(d, a, rows);
    return;
  }
  static thread_local Scratch<float> scratch;
  const size_t ntiles = (size_t(a->S) + kBk - 1) / kBk;
  g3_tile_info* info =
      reinterpret_cast<g3_tile_info*>(scratch.Get(ntiles * (sizeof(g3_tile_info) / sizeof(float) + 1)));
  for (size_t k = 0; k < ntiles; ++k) info[k] = g3_tile_info_of(a, int64_t(k * kBk), int64_t(kBk));
  CoreDecode<kDH, kG, kKV, kBC>(d, a, rows, info, ntiles);
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
