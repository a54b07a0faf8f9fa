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
#include "hwy/contrib/math/math-inl.h"
#include "mask_rule.h"

HWY_BEFORE_NAMESPACE();
namespace g3 {
namespace HWY_NAMESPACE {
namespace flash {

namespace hn = hwy::HWY_NAMESPACE;

// Masked logits become this finite value before the running max is taken, and
// their probabilities are forced to exactly zero, so no inf - inf ever occurs.
constexpr float kNegBig = -1e30f;

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
      const auto e = hn::IfThenZeroElse(hn::Eq(s, negbig), hn::Exp(dk, hn::Sub(s, mv)));
      hn::StoreU(e, dk, sr + j);
      sum = hn::Add(sum, e);
    }
    const float c = expf(m[r] - m_new);
    corr[r] = c;
    l[r] = l[r] * c + hn::GetLane(hn::SumOfLanes(dk, sum));
    m[r] = m_new;
  }
}

// Normalises a finished row (SPEC 1.3 step H's division, deferred) and
// writes lse; a row that saw no key gets zeros and lse = -inf. H is a
// multiple of Lanes(d).
template <class D>
HWY_INLINE void FinishRow(D d, const float* O, float m, float l, size_t H, float* out, float* lse) {
  const size_t NL = hn::Lanes(d);
  if (!(l > 0)) {
    for (size_t h = 0; h < H; h += NL) hn::StoreU(hn::Zero(d), d, out + h);
    if (lse) *lse = -INFINITY;
    return;
  }
  const auto inv = hn::Set(d, 1.0f / l);
  for (size_t h = 0; h < H; h += NL) hn::StoreU(hn::Mul(hn::LoadU(d, O + h), inv), d, out + h);
  if (lse) *lse = m + logf(l);
}

}  // namespace flash
}  // namespace HWY_NAMESPACE
}  // namespace g3
HWY_AFTER_NAMESPACE();

#endif  // G3_SOFTMAX_INL_H_
