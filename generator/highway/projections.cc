// The foreach_target translation unit of the projection kernels: Highway
// re-includes this file once per compiled target (SSSE3, SSE4, AVX2, AVX3,
// AVX3_DL and the scalar fallback), each pass compiling projections-inl.h
// with that target's attributes into namespace g3::N_<TARGET>. The part
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
#include <hwy/targets.h>

#include "generator/errors.h"

namespace g3 {
namespace {

struct ProjectionEntry {
  const char* isa;
  long long bit;
  g3_gemm_fn gemm;
  g3_rmsnorm_fn rmsnorm;
};

// One row per target compiled into this TU (HWY_TARGETS), lowest first.
constexpr ProjectionEntry kEntries[] = {
#if HWY_TARGETS & HWY_SCALAR
    {"scalar", HWY_SCALAR, &N_SCALAR::ProjectionsGemm, &N_SCALAR::ProjectionsRmsNorm},
#endif
#if HWY_TARGETS & HWY_SSSE3
    {"ssse3", HWY_SSSE3, &N_SSSE3::ProjectionsGemm, &N_SSSE3::ProjectionsRmsNorm},
#endif
#if HWY_TARGETS & HWY_SSE4
    {"sse4", HWY_SSE4, &N_SSE4::ProjectionsGemm, &N_SSE4::ProjectionsRmsNorm},
#endif
#if HWY_TARGETS & HWY_AVX2
    {"avx2", HWY_AVX2, &N_AVX2::ProjectionsGemm, &N_AVX2::ProjectionsRmsNorm},
#endif
#if HWY_TARGETS & HWY_AVX3
    {"avx3", HWY_AVX3, &N_AVX3::ProjectionsGemm, &N_AVX3::ProjectionsRmsNorm},
#endif
#if HWY_TARGETS & HWY_AVX3_DL
    {"avx3_dl", HWY_AVX3_DL, &N_AVX3_DL::ProjectionsGemm, &N_AVX3_DL::ProjectionsRmsNorm},
#endif
};

const ProjectionEntry& entry_for(const std::string& isa) {
  std::string compiled;
  for (const auto& e : kEntries) {
    if (isa == e.isa) {
      // The scalar target runs everywhere; the others need the CPU's support,
      // or the first call would die with SIGILL instead of a clear message.
      if (e.bit != HWY_SCALAR && (hwy::SupportedTargets() & e.bit) == 0)
        throw InputError("Highway projections: this CPU does not support ISA '" + isa + "'");
      return e;
    }
    compiled += (compiled.empty() ? "" : ", ") + std::string(e.isa);
  }
  throw InputError("Highway projections: ISA '" + isa + "' is not compiled into this build (compiled: " + compiled +
                   ")");
}

}  // namespace

g3_gemm_fn highway_gemm(const std::string& isa) { return entry_for(isa).gemm; }
g3_rmsnorm_fn highway_rmsnorm(const std::string& isa) { return entry_for(isa).rmsnorm; }

}  // namespace g3
#endif  // HWY_ONCE
