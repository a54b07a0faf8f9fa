#include "runtime/dispatch/backends.h"

#include "generator/errors.h"
#include "generator/xbyak/amx_core.h"
#include "runtime/reference/reference.h"

// The one place that knows whether the LLVM JIT is part of this binary
// (-DG3ATTN_WITH_LLVM); everything else asks the table below.
#ifdef G3_LLVM_AVAILABLE
#include "generator/llvm/llvm_backend.h"
#endif

namespace g3 {

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::Qk: return "qk";
    case Stage::Core: return "core";
    case Stage::Gemm: return "gemm";
    case Stage::RmsNorm: return "rmsnorm";
  }
  return "?";
}

bool has_stage(const g3_kernel_table& t, Stage s) {
  switch (s) {
    case Stage::Qk: return t.qk != nullptr;
    case Stage::Core: return t.core != nullptr;
    case Stage::Gemm: return t.gemm != nullptr;
    case Stage::RmsNorm: return t.rmsnorm != nullptr;
  }
  return false;
}

void copy_stage(g3_kernel_table& to, const g3_kernel_table& from, Stage s) {
  switch (s) {
    case Stage::Qk: to.qk = from.qk; break;
    case Stage::Core: to.core = from.core; break;
    case Stage::Gemm: to.gemm = from.gemm; break;
    case Stage::RmsNorm: to.rmsnorm = from.rmsnorm; break;
  }
}

namespace {

std::string always_available(const KernelKey&, const std::string&) { return ""; }

BackendKernels reference_build(const KernelKey&, const std::string&) {
  BackendKernels k;
  k.table = ref::kernel_table();
  k.isa = "scalar";
  k.specialised = false;
  return k;
}

std::string xbyak_why_unavailable(const KernelKey& key, const std::string& isa) {
  std::string why;
  return xbyak_available(key, isa, &why) ? "" : why;
}

std::string amx_why_unavailable(const KernelKey& key, const std::string& isa) {
  std::string why;
  return amx_available(key, isa, &why) ? "" : why;
}

#ifdef G3_LLVM_AVAILABLE
constexpr bool kLlvmInBuild = true;
std::string llvm_why_unavailable(const KernelKey& key, const std::string&) {
  // The emitted core computes in f32 only; bf16 compute is served by others.
  if (key.compute == DType::BF16) return "the llvm backend has no bf16 compute mode";
  std::string why;
  return llvm_available(&why) ? "" : why;
}
BackendKernels llvm_build(const KernelKey& key, const std::string& isa) { return llvm_kernels(key, isa); }
int (*const kLlvmCompiles)() = &llvm_compiles;
int (*const kLlvmCacheHits)() = &llvm_cache_hits;
#else
constexpr bool kLlvmInBuild = false;
constexpr const char* kLlvmNotBuilt = "the llvm backend is not part of this build (configure with -DG3ATTN_WITH_LLVM=ON)";
std::string llvm_why_unavailable(const KernelKey&, const std::string&) { return kLlvmNotBuilt; }
BackendKernels llvm_build(const KernelKey&, const std::string&) { throw InputError(kLlvmNotBuilt); }
int (*const kLlvmCompiles)() = nullptr;
int (*const kLlvmCacheHits)() = nullptr;
#endif

}  // namespace

const std::vector<Backend>& backends() {
  // Highway serves every ISA that --isa accepts (resolve_isa refuses targets
  // this build did not compile or this CPU cannot run), so it is never
  // unavailable; for any other name its build says why. A JIT that cannot
  // serve a request falls back to Highway, which also serves the stages it
  // does not JIT (projections and norms; for xbyak and amx the QK stage too).
  // amx is the AMX tile core of the bf16 compute mode: it serves only keys
  // with compute bf16, on CPUs with AMX-BF16 whose kernel granted the tile
  // data, under the avx3_dl cap (amx_permission.h, amx_core.h say why not).
  static const std::vector<Backend> list = {
      {"reference", BackendKind::Reference, nullptr, true, &always_available, &reference_build, nullptr, nullptr},
      {"highway", BackendKind::Aot, "reference", true, &always_available, &highway_kernels, nullptr, nullptr},
      {"llvm", BackendKind::Jit, "highway", kLlvmInBuild, &llvm_why_unavailable, &llvm_build, kLlvmCompiles,
       kLlvmCacheHits},
      {"xbyak", BackendKind::Jit, "highway", true, &xbyak_why_unavailable, &xbyak_kernels, nullptr, nullptr},
      {"amx", BackendKind::Jit, "highway", true, &amx_why_unavailable, &amx_kernels, nullptr, nullptr},
  };
  return list;
}

const Backend* find_backend(const std::string& name) {
  for (const Backend& b : backends())
    if (name == b.name) return &b;
  return nullptr;
}

// The auto rule. Every backend of a compute mode computes the same numerics,
// so auto is purely a speed choice, and a speed rule measured on one CPU
// does not transfer to another (vdpbf16ps is twice the fp32 peak on Zen 4
// and half of it on Emerald Rapids). Until a measured profile exists, auto
// takes the AOT Highway kernels: the fastest prefill core on every CPU this
// project has run on (Zen 4, Zen 5, Emerald Rapids), and a decode core that
// reads K/V at the memory's pace; its per-call cost on short decode calls
// (a local layer's window) is where another backend can win by a measurable
// margin, which is what `g3attn tune` is for. One exception rests on the
// hardware, not on a timing: prefill-sized calls in the bf16 compute mode go to the amx core wherever
// it can serve the key, since AMX tiles multiply bf16 at many times any
// vector unit's rate (13x the fp32 FMA peak on Emerald Rapids), while
// Highway's bf16 mode pays for its rounding in vector code.
const Backend& auto_backend(const KernelKey& key, Phase phase, const std::string& isa) {
  static const Backend& highway = *find_backend("highway");
  static const Backend& amx = *find_backend("amx");
  if (phase == Phase::Prefill && key.compute == DType::BF16 && amx.why_unavailable(key, isa).empty()) return amx;
  return highway;
}

}  // namespace g3
