// The foreach_target translation unit of the projection kernels: Highway
// re-includes this file once per compiled target (templates/hwy_targets.h),
// each pass compiling projections-inl.h with that target's attributes into
// namespace g3::N_<TARGET>. The part
// under HWY_ONCE is compiled once and hands out the per-target entry points
// by ISA name, so the runtime dispatches once per layer call and the kernels
// below never dispatch again.
#include "generator/highway/projections.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "generator/highway/projections.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "templates/projections-inl.h"

HWY_BEFORE_NAMESPACE();
namespace g3 {
namespace HWY_NAMESPACE {

// Plain functions with the contract's signatures, so their addresses are
// g3_gemm_fn / g3_rmsnorm_fn values.
void ProjectionsGemm(const g3_gemm_args* args) { proj::Gemm(args); }

void ProjectionsRmsNorm(const float* x, int64_t rows, int64_t n, int64_t x_stride, const float* w, float eps,
                        const float* residual, float* y, int64_t y_stride) {
  proj::RmsNorm(x, rows, n, x_stride, w, eps, residual, y, y_stride);
}

}  // namespace HWY_NAMESPACE
}  // namespace g3
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <iterator>

#include "generator/errors.h"
#include "generator/isa.h"
#include "templates/hwy_targets.h"

namespace g3 {
namespace {

struct ProjectionEntry {
  const char* isa;
  int64_t bit;
  g3_gemm_fn gemm;
  g3_rmsnorm_fn rmsnorm;
};

#define G3_PROJECTION_ENTRY(bit, name, ns) {name, bit, &ns::ProjectionsGemm, &ns::ProjectionsRmsNorm},
const ProjectionEntry kEntries[] = {G3_HWY_FOR_EACH_TARGET(G3_PROJECTION_ENTRY)};  // best first
#undef G3_PROJECTION_ENTRY

const ProjectionEntry& entry_for(const std::string& isa) {
  for (const auto& e : kEntries) {
    if (isa != e.isa) continue;
    if (!target_runs_here(e.bit)) throw InputError("Highway projections: this CPU does not support ISA '" + isa + "'");
    return e;
  }
  std::string compiled;  // lowest first, as --isa lists them
  for (auto e = std::rbegin(kEntries); e != std::rend(kEntries); ++e)
    compiled += (compiled.empty() ? "" : ", ") + std::string(e->isa);
  throw InputError("Highway projections: ISA '" + isa + "' is not compiled into this build (compiled: " + compiled +
                   ")");
}

}  // namespace

g3_gemm_fn highway_gemm(const std::string& isa) { return entry_for(isa).gemm; }
g3_rmsnorm_fn highway_rmsnorm(const std::string& isa) { return entry_for(isa).rmsnorm; }

}  // namespace g3
#endif  // HWY_ONCE
