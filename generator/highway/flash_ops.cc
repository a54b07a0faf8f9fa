// The foreach_target translation unit behind flash_ops.h: the softmax step
// and row finish of templates/softmax-inl.h with C-compatible signatures,
// once per compiled Highway target, and the table that picks one by ISA.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "generator/highway/flash_ops.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "templates/softmax-inl.h"

HWY_BEFORE_NAMESPACE();
namespace g3 {
namespace HWY_NAMESPACE {
namespace flash_ops {

namespace hn = hwy::HWY_NAMESPACE;

void InitRows(int64_t n, float* m, float* l) { flash::InitRows(size_t(n), m, l); }

void SoftmaxTile(float* S, int64_t stride, int64_t rows, int64_t width, int32_t full, int64_t s0, const int32_t* kp,
                 const int32_t* kv, const g3_row_bounds* rb, float* m, float* l, float* corr) {
  // Widths are multiples of 16 (the JITs' tiles), so the full vector of any
  // target divides them.
  flash::SoftmaxTile(hn::ScalableTag<float>(), size_t(rows), size_t(width), S, size_t(stride), full != 0, s0, kp,
                     kv, rb, m, l, corr);
}

void FinishRow(const float* O, float m, float l, int64_t H, float* out, float* lse) {
  const hn::ScalableTag<float> d;
  if (size_t(H) % hn::Lanes(d) == 0) {
    flash::FinishRow(d, O, m, l, size_t(H), out, lse);
  } else {
    flash::FinishRow(hn::CappedTag<float, 1>(), O, m, l, size_t(H), out, lse);
  }
}

}  // namespace flash_ops
}  // namespace HWY_NAMESPACE
}  // namespace g3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <stdexcept>

#include "generator/highway/flash_ops.h"
#include "generator/isa.h"
#include "templates/hwy_targets.h"

namespace g3 {
namespace {

struct Entry {
  int64_t bit;
  FlashOps ops;
};

#define G3_FLASH_ENTRY(bit, name, ns) \
  {bit, {&ns::flash_ops::InitRows, &ns::flash_ops::SoftmaxTile, &ns::flash_ops::FinishRow, name}},
const Entry kEntries[] = {G3_HWY_FOR_EACH_TARGET(G3_FLASH_ENTRY)};  // best first
#undef G3_FLASH_ENTRY

}  // namespace

const FlashOps& flash_ops(const std::string& isa_cap) {
  const int cap = isa_cap == "best" ? int(isa_names().size()) : isa_rank(isa_cap);
  for (const Entry& e : kEntries)
    if (target_runs_here(e.bit) && isa_rank(e.ops.isa) <= cap) return e.ops;
  // HWY_SCALAR is always compiled (Highway's fallback), so only an unknown
  // name gets here.
  throw std::logic_error("flash_ops: no Highway target at or below '" + isa_cap + "'");
}

}  // namespace g3
#endif  // HWY_ONCE
