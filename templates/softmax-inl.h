// The online softmax of every attention core (SPEC 1.3 steps G-I in the
// FlashAttention form), written once and compiled per Highway target: the
// masked softmax step over one tile of keys and the finish of a row. The
// Highway core calls these inline; the Xbyak and LLVM cores call the same
// code through generator/highway/flash_ops.h, so the rule cannot differ
// between backends. Which slots a row sees comes from mask_rule.h.
//
// Row state, per query row: m (running maximum of its visible logits, kNegBig
// before the first), l (running sum of exp(logit - m)) and the output
// accumulator O, which the caller owns and rescales by `corr` before adding
// the tile's P.V:
//   m' = max(m, max_s visible logit_s)
//   p_s = exp(logit_s - m') for visible s, exactly 0 otherwise
//   corr = exp(m - m'),  l' = l * corr + sum_s p_s
// and at the end out = O / l, lse = m + log l (zeros and -inf for a row that
// saw no key: the contract's rule for don't-care rows). NL below is the
// number of f32 lanes of a vector (hn::Lanes), never SPEC's N (query heads).

// Per-target include guard: toggled by foreach_target between passes.
#if defined(G3_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef G3_SOFTMAX_INL_H_
#undef G3_SOFTMAX_INL_H_
#else
#define G3_SOFTMAX_INL_H_
#endif

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "hwy/highway.h"
#include "mask_rule.h"

HWY_BEFORE_NAMESPACE();
namespace g3 {
namespace HWY_NAMESPACE {
namespace flash {

namespace hn = hwy::HWY_NAMESPACE;

// Masked logits become this finite value before the running max is taken, and
// their probabilities are forced to exactly zero, so no inf - inf ever occurs.
constexpr float kNegBig = -1e30f;

// exp(x) for x <= 0, the only arguments the softmax takes (a logit minus a
// running maximum at least as large, or an old maximum minus a new one): 13
// vector operations against about 25 in hwy::Exp, which is what the softmax
// step costs per query-key pair beside the 2 x head_dim FMAs of QK and PV.
// x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2 (ln2 in two
// parts, Cody-Waite, so r is exact to float rounding for every n); exp(r) =
// 1 + r q(r) with q of degree 5 interpolated at Chebyshev nodes (0.2 ulp in
// exact arithmetic, about 1 ulp as evaluated); then 2^n is added to the
// exponent bits. The round-to-integer is the float trick of adding 1.5 x
// 2^23 (no float-to-int conversion with its overflow fix-ups): that sum's low
// mantissa bits hold n, and shifted left by 23 they are n's exponent
// increment. Arguments below -86 are taken as -86 (exp = 4e-38 where the
// true value is smaller), which keeps 2^n a normal number; NaN becomes -86
// too (Max returns its second operand on every target for NaN), as hwy::Exp
// maps NaN to 0.
template <class DK>
HWY_INLINE hn::Vec<DK> ExpNonPositive(DK dk, hn::Vec<DK> x) {
  const hn::RebindToSigned<DK> di;
  const auto shifter = hn::Set(dk, 12582912.0f);  // 1.5 x 2^23
  x = hn::Max(x, hn::Set(dk, -86.0f));
  const auto t = hn::MulAdd(x, hn::Set(dk, 1.44269504088896341f), shifter);
  const auto n = hn::Sub(t, shifter);
  auto r = hn::MulAdd(n, hn::Set(dk, -0.693145751953125f), x);
  r = hn::MulAdd(n, hn::Set(dk, -1.42860676533018704e-6f), r);
  auto q = hn::Set(dk, 0.0013933641603216529f);
  q = hn::MulAdd(q, r, hn::Set(dk, 0.008369148708879948f));
  q = hn::MulAdd(q, r, hn::Set(dk, 0.04166646674275398f));
  q = hn::MulAdd(q, r, hn::Set(dk, 0.16666504740715027f));
  q = hn::MulAdd(q, r, hn::Set(dk, 0.5f));
  q = hn::MulAdd(q, r, hn::Set(dk, 1.0f));
  const auto e = hn::MulAdd(q, r, hn::Set(dk, 1.0f));
  return hn::BitCast(dk, hn::Add(hn::BitCast(di, e), hn::ShiftLeft<23>(hn::BitCast(di, t))));
}

// The state of rows that have seen nothing yet.
HWY_INLINE void InitRows(size_t n, float* m, float* l) {
  for (size_t r = 0; r < n; ++r) {
    m[r] = kNegBig;
    l[r] = 0.0f;
  }
}

// One tile of `width` keys (slots s0 .. s0 + width - 1) for nr rows: `logits`
// holds the rows' logits, row r at logits + r * stride; they are replaced by
// the unnormalised probabilities p. kp and kv hold the tile's stored positions
// and validity (-1 valid, 0 not) as int32, padded with invalid slots past the
// end of the cache; rb the rows' bounds. `full`: the caller classified the
// tile as visible to every row in full (g3_classify), so no element is
// masked. width is a multiple of Lanes(dk).
template <class DK>
HWY_INLINE void SoftmaxTile(DK dk, size_t nr, size_t width, float* logits, size_t stride, bool full, int64_t s0,
                            const int32_t* kp, const int32_t* kv, const g3_row_bounds* rb, float* m, float* l,
                            float* corr) {
  const size_t NL = hn::Lanes(dk);
  const hn::RebindToSigned<DK> di;
  const auto negbig = hn::Set(dk, kNegBig);
  for (size_t r = 0; r < nr; ++r) {
    float* sr = logits + r * stride;
    auto mx = negbig;
    if (full) {
      for (size_t j = 0; j < width; j += NL) mx = hn::Max(mx, hn::LoadU(dk, sr + j));
    } else {
      // g3_visible, vectorised: valid, lo <= kpos <= hi, and the slot rule
      // as an offset inside the tile (offset j is hidden iff j > last).
      const auto hi = hn::Set(di, rb[r].hi), lo = hn::Set(di, rb[r].lo);
      const auto last = hn::Set(di, int32_t(g3_slot_limit(rb[r], s0, int64_t(width)) - 1));
      for (size_t j = 0; j < width; j += NL) {
        const auto p = hn::LoadU(di, kp + j);
        const auto off = hn::Iota(di, int32_t(j));
        const auto hidden = hn::Or(hn::Or(hn::Or(hn::Gt(p, hi), hn::Gt(lo, p)), hn::Gt(off, last)),
                                   hn::Eq(hn::LoadU(di, kv + j), hn::Zero(di)));
        const auto s = hn::IfThenElse(hn::RebindMask(dk, hidden), negbig, hn::LoadU(dk, sr + j));
        hn::StoreU(s, dk, sr + j);
        mx = hn::Max(mx, s);
      }
    }
    const float m_tile = hn::GetLane(hn::MaxOfLanes(dk, mx));
    const float m_new = m_tile > m[r] ? m_tile : m[r];
    const auto mv = hn::Set(dk, m_new);
    auto sum = hn::Zero(dk);
    for (size_t j = 0; j < width; j += NL) {
      const auto s = hn::LoadU(dk, sr + j);
      // Masked logits are exactly kNegBig; their probability is exactly 0
      // even when the whole row is masked so far (then m_new is kNegBig too).
      const auto e = hn::IfThenZeroElse(hn::Eq(s, negbig), ExpNonPositive(dk, hn::Sub(s, mv)));
      hn::StoreU(e, dk, sr + j);
      sum = hn::Add(sum, e);
    }
    const float c = expf(m[r] - m_new);
    corr[r] = c;
    l[r] = l[r] * c + hn::GetLane(hn::SumOfLanes(dk, sum));
    m[r] = m_new;
  }
}

// The same step with rows in vector lanes (the prefill core's S^T = K Q^T
// layout): Lt + j * stride holds key j's logits for nv vectors of rows, and
// is replaced by their probabilities; keys j < nk. The keys come in groups
// of `group`; bit g of `masked` says group g needs the per-element mask
// (the others are visible to every row in full). kp and kv (as above) are
// per key; the rows' bounds lo, hi (stored positions) and last (the last
// key index the slot rule lets a row see) per row. m, l and corr are per
// row. Each row's m, p, corr and l come out as SoftmaxTile computes them;
// only the order in which a row's tile sum is added up differs.
template <class DK>
HWY_INLINE void SoftmaxTileT(DK dk, size_t nv, size_t nk, float* Lt, size_t stride, uint32_t masked, size_t group,
                             const int32_t* kp, const int32_t* kv, const int32_t* lo, const int32_t* hi,
                             const int32_t* last, float* m, float* l, float* corr) {
  const size_t NL = hn::Lanes(dk);
  const hn::RebindToSigned<DK> di;
  const auto negbig = hn::Set(dk, kNegBig);
  for (size_t v = 0; v < nv; ++v) {
    float* col = Lt + v * NL;
    if (masked) {
      // g3_visible, vectorised over rows: valid, lo <= kpos <= hi, and the
      // slot rule as a key index (key j is hidden from a row iff j > last).
      const auto vlo = hn::LoadU(di, lo + v * NL), vhi = hn::LoadU(di, hi + v * NL);
      const auto vlast = hn::LoadU(di, last + v * NL);
      for (size_t g = 0; g * group < nk; ++g) {
        if (!((masked >> g) & 1u)) continue;
        const size_t j1 = (g + 1) * group < nk ? (g + 1) * group : nk;
        for (size_t j = g * group; j < j1; ++j) {
          float* x = col + j * stride;
          if (kv[j] == 0) {
            hn::Store(negbig, dk, x);
            continue;
          }
          const auto p = hn::Set(di, kp[j]);
          const auto hidden =
              hn::Or(hn::Or(hn::Gt(p, vhi), hn::Gt(vlo, p)), hn::Gt(hn::Set(di, int32_t(j)), vlast));
          hn::Store(hn::IfThenElse(hn::RebindMask(dk, hidden), negbig, hn::Load(dk, x)), dk, x);
        }
      }
    }
    auto mx = negbig;
    for (size_t j = 0; j < nk; ++j) mx = hn::Max(mx, hn::Load(dk, col + j * stride));
    const auto m_old = hn::LoadU(dk, m + v * NL);
    const auto m_new = hn::Max(mx, m_old);
    auto sum = hn::Zero(dk);
    for (size_t j = 0; j < nk; ++j) {
      float* x = col + j * stride;
      const auto s = hn::Load(dk, x);
      auto e = ExpNonPositive(dk, hn::Sub(s, m_new));
      // Masked logits are exactly kNegBig; their probability is exactly 0
      // even when the whole row is masked so far (then m_new is kNegBig too).
      if (masked) e = hn::IfThenZeroElse(hn::Eq(s, negbig), e);
      hn::Store(e, dk, x);
      sum = hn::Add(sum, e);
    }
    const auto c = ExpNonPositive(dk, hn::Sub(m_old, m_new));
    hn::StoreU(c, dk, corr + v * NL);
    hn::StoreU(hn::MulAdd(hn::LoadU(dk, l + v * NL), c, sum), dk, l + v * NL);
    hn::StoreU(m_new, dk, m + v * NL);
  }
}

// The finish of a row (SPEC 1.3 step H's division, deferred): returns the
// factor its accumulator is multiplied by, 1 / l, and writes lse = m + log l;
// for a row that saw no key, 0 (its output is zeros, whatever its
// accumulator holds) and lse = -inf.
HWY_INLINE float FinishFactor(float m, float l, float* lse) {
  if (!(l > 0)) {
    if (lse) *lse = -INFINITY;
    return 0.0f;
  }
  if (lse) *lse = m + logf(l);
  return 1.0f / l;
}

// Normalises a finished row: out = O * FinishFactor. H is a multiple of
// Lanes(d).
template <class D>
HWY_INLINE void FinishRow(D d, const float* O, float m, float l, size_t H, float* out, float* lse) {
  const size_t NL = hn::Lanes(d);
  const float f = FinishFactor(m, l, lse);
  if (f == 0.0f) {
    for (size_t h = 0; h < H; h += NL) hn::StoreU(hn::Zero(d), d, out + h);
    return;
  }
  const auto inv = hn::Set(d, f);
  for (size_t h = 0; h < H; h += NL) hn::StoreU(hn::Mul(hn::LoadU(d, O + h), inv), d, out + h);
}

// The same for an accumulator whose elements lie `stride` floats apart (a
// column of the prefill core's transposed accumulators).
HWY_INLINE void FinishRowStrided(const float* O, size_t stride, float m, float l, size_t H, float* out,
                                 float* lse) {
  const float f = FinishFactor(m, l, lse);
  for (size_t h = 0; h < H; ++h) out[h] = f == 0.0f ? 0.0f : O[h * stride] * f;
}

}  // namespace flash
}  // namespace HWY_NAMESPACE
}  // namespace g3
HWY_AFTER_NAMESPACE();

#endif  // G3_SOFTMAX_INL_H_
