// bf16 rounding in vector code, once per Highway target: round to nearest
// even (the rule of generator/bf16.h and of the hardware's vcvtneps2bf16),
// NaN kept a quiet NaN. Used to store bf16 K/V (attention-inl.h) and to
// round the inputs of dot products in the bf16 compute mode
// (kernel_contract.h, G3_COMPUTE_BF16).

// Per-target include guard: toggled by foreach_target between passes.
#if defined(G3_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef G3_BF16_INL_H_
#undef G3_BF16_INL_H_
#else
#define G3_BF16_INL_H_
#endif

#include <stdint.h>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace g3 {
namespace HWY_NAMESPACE {
namespace bf16 {

namespace hn = hwy::HWY_NAMESPACE;

// The bits of v rounded to bf16, as int32 lanes holding the bf16 value in
// their low 16 bits.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> RoundedBits(D d, hn::Vec<D> v) {
  const hn::RebindToSigned<D> di;
  const hn::RebindToUnsigned<D> du;
  (void)d;
  const auto u = hn::BitCast(di, v);
  const auto hi = hn::And(hn::ShiftRight<16>(u), hn::Set(di, 0xffff));
  const auto lsb = hn::And(hi, hn::Set(di, 1));
  // Unsigned add done in signed lanes: wrap-around is what we want, and the
  // logical shift afterwards is emulated by the mask.
  const auto sum = hn::BitCast(di, hn::Add(hn::BitCast(du, u), hn::BitCast(du, hn::Add(hn::Set(di, 0x7fff), lsb))));
  const auto r = hn::And(hn::ShiftRight<16>(sum), hn::Set(di, 0xffff));
  const auto is_nan = hn::Gt(hn::And(u, hn::Set(di, 0x7fffffff)), hn::Set(di, 0x7f800000));
  return hn::IfThenElse(is_nan, hn::Or(hi, hn::Set(di, 0x40)), r);
}

// v rounded to bf16 and widened back to f32.
template <class D>
HWY_INLINE hn::Vec<D> Round(D d, hn::Vec<D> v) {
  return hn::BitCast(d, hn::ShiftLeft<16>(RoundedBits(d, v)));
}

// Stores Lanes(d) floats as bf16.
template <class D>
HWY_INLINE void Store(D d, hn::Vec<D> v, uint16_t* p) {
  const hn::Rebind<uint16_t, D> d16;
  hn::StoreU(hn::DemoteTo(d16, RoundedBits(d, v)), d16, p);
}

// n floats (a multiple of Lanes(d)) rounded to bf16 in place.
template <class D>
HWY_INLINE void RoundInPlace(D d, float* x, size_t n) {
  for (size_t i = 0; i < n; i += hn::Lanes(d)) hn::StoreU(Round(d, hn::LoadU(d, x + i)), d, x + i);
}

}  // namespace bf16
}  // namespace HWY_NAMESPACE
}  // namespace g3
HWY_AFTER_NAMESPACE();

#endif  // G3_BF16_INL_H_
