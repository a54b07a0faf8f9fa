#include "runtime/dispatch/kernel_registry.h"

#include <future>
#include <map>
#include <mutex>

#include "generator/errors.h"
#include "runtime/reference/reference.h"

namespace g3 {

const std::vector<std::string>& backend_names() {
  static const std::vector<std::string> v = {"reference", "highway", "llvm", "xbyak", "auto"};
  return v;
}

std::string parse_backend(const std::string& name) {
  for (const auto& b : backend_names())
    if (b == name) return name;
  throw InputError("--backend: unknown backend '" + name + "' (valid: reference, highway, llvm, xbyak, auto)");
}

namespace {

std::mutex g_mu;
std::map<std::string, int> g_built;

BackendKernels reference_kernels() {
  BackendKernels k;
  k.table = ref::kernel_table();
  k.isa = "scalar";
  k.specialised = false;
  return k;
}

// One backend's kernels for a key, or an InputError saying why not.
BackendKernels build(const std::string& backend, const KernelKey& key, const std::string& isa) {
  if (backend == "reference") return reference_kernels();
  if (backend == "highway") {
#ifdef G3_HIGHWAY_AVAILABLE
    return highway_kernels(key, isa);
#else
    throw InputError("the highway backend is not part of this build");
#endif
  }
  if (backend == "llvm") {
#ifdef G3_LLVM_AVAILABLE
    std::string why;
    if (!llvm_available(&why)) throw InputError("llvm backend unavailable: " + why);
    return llvm_kernels(key, isa);
#else
    throw InputError("the llvm backend is not part of this build (configure with -DG3ATTN_WITH_LLVM=ON)");
#endif
  }
  if (backend == "xbyak") {
#ifdef G3_XBYAK_AVAILABLE
    std::string why;
    if (!xbyak_available(key, isa, &why)) throw InputError("xbyak backend unavailable: " + why);
    return xbyak_kernels(key, isa);
#else
    throw InputError("the xbyak backend is not part of this build");
#endif
  }
  throw InputError("--backend: unknown backend '" + backend + "'");
}

// Memoised build: the first caller builds, others wait on the same future.
BackendKernels cached_build(const std::string& backend, const KernelKey& key, const std::string& isa) {
  static std::map<std::string, std::shared_future<BackendKernels>> memo;
  std::string id = backend + "|" + isa + "|" + key.str();
  std::promise<BackendKernels> promise;
  std::shared_future<BackendKernels> fut;
  bool mine = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = memo.find(id);
    if (it == memo.end()) {
      fut = promise.get_future().share();
      memo.emplace(id, fut);
      mine = true;
    } else {
      fut = it->second;
    }
  }
  if (mine) {
    try {
      BackendKernels k = build(backend, key, isa);
      {
        std::lock_guard<std::mutex> lock(g_mu);
        ++g_built[backend];
      }
      promise.set_value(k);
    } catch (...) {
      promise.set_exception(std::current_exception());
    }
  }
  return fut.get();
}

// Whether a JIT backend can serve (key, isa) here; `why` says why not.
bool jit_available(const std::string& backend, const KernelKey& key, const std::string& isa, std::string* why) {
  if (backend == "xbyak") {
#ifdef G3_XBYAK_AVAILABLE
    return xbyak_available(key, isa, why);
#else
    *why = "the xbyak backend is not part of this build";
    return false;
#endif
  }
  if (backend == "llvm") {
#ifdef G3_LLVM_AVAILABLE
    (void)key;
    (void)isa;
    return llvm_available(why);
#else
    *why = "the llvm backend is not part of this build (configure with -DG3ATTN_WITH_LLVM=ON)";
    return false;
#endif
  }
  return true;
}

std::string aot_backend() {
#ifdef G3_HIGHWAY_AVAILABLE
  return "highway";
#else
  return "reference";
#endif
}

// The auto rule. Every backend computes the same numerics (f32 arithmetic;
// bf16 KV is storage only), so auto is purely a speed choice, and a speed
// rule measured on one CPU does not transfer to another (vdpbf16ps is twice
// the fp32 peak on Zen 4 and half of it on Emerald Rapids). Until a
// measured profile exists, auto takes the AOT Highway kernels: on both CPUs
// the bench measured them fastest or within a few percent of the fastest on
// f32 KV and on bf16 KV with widening.
std::string auto_backend() { return aot_backend(); }

}  // namespace

KernelChoice kernels_for(const KernelKey& key, const std::string& backend_in, const std::string& isa) {
  std::string backend = parse_backend(backend_in);
  KernelChoice c;
  if (backend == "auto") {
    backend = auto_backend();
  } else if (backend == "llvm" || backend == "xbyak") {
    // An unavailable JIT falls back to the AOT kernels, saying why.
    std::string why;
    if (!jit_available(backend, key, isa, &why)) {
      c.fallback = backend + " unavailable (" + why + "), using " + aot_backend();
      backend = aot_backend();
    }
  }
  c.kernels = cached_build(backend, key, isa);
  c.backend = backend;
  // Stages this backend does not provide come from Highway (same ISA), else
  // from the reference.
  BackendKernels fill;
  bool need_fill = !c.kernels.table.qk || !c.kernels.table.core || !c.kernels.table.gemm || !c.kernels.table.rmsnorm;
  std::string fill_name = "reference";
  if (need_fill) {
#ifdef G3_HIGHWAY_AVAILABLE
    if (backend != "reference" && backend != "highway") {
      fill = cached_build("highway", key, isa);
      fill_name = "highway";
    } else {
      fill = reference_kernels();
    }
#else
    fill = reference_kernels();
#endif
  }
  auto take = [&](auto& mine, auto theirs, int stage) {
    if (mine) {
      c.stages[stage] = backend;
    } else {
      mine = theirs;
      c.stages[stage] = fill_name;
    }
  };
  take(c.kernels.table.qk, fill.table.qk, 0);
  take(c.kernels.table.core, fill.table.core, 1);
  take(c.kernels.table.gemm, fill.table.gemm, 2);
  take(c.kernels.table.rmsnorm, fill.table.rmsnorm, 3);
  return c;
}

int kernels_built(const std::string& backend) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_built.find(backend);
  return it == g_built.end() ? 0 : it->second;
}

}  // namespace g3
