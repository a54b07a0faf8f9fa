// The kernel backends as one ordered list, in the style of oneDNN's
// implementation lists: each entry says what it is called, whether it can
// serve a (key, ISA) here and why not, and how to build its kernels. The
// kernel registry (kernel_registry.h) validates --backend names, applies
// `auto`, falls back and fills missing stages through this list only, so a
// new backend is one entry in backends.cc and no string or #ifdef elsewhere.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "generator/backend_api.h"
#include "generator/kernel_key.h"
#include "runtime/dispatch/profile.h"
#include "templates/kernel_contract.h"

namespace g3 {

// The stages of one layer's kernel table (templates/kernel_contract.h), in
// the order of g3_kernel_table.
enum class Stage { Qk, Core, Gemm, RmsNorm };
inline constexpr Stage kStages[] = {Stage::Qk, Stage::Core, Stage::Gemm, Stage::RmsNorm};
inline constexpr size_t kStageCount = sizeof(kStages) / sizeof(kStages[0]);

// "qk", "core", "gemm", "rmsnorm": the stage's name in JSON (plan, bench).
const char* stage_name(Stage s);
// Whether a table provides the stage (a null entry means "not provided").
bool has_stage(const g3_kernel_table& t, Stage s);
// Copies one stage's function from `from` into `to`.
void copy_stage(g3_kernel_table& to, const g3_kernel_table& from, Stage s);

// The backend serving each stage of a kernel table, indexed by Stage.
struct StageBackends {
  std::string& operator[](Stage s) { return names[size_t(s)]; }
  const std::string& operator[](Stage s) const { return names[size_t(s)]; }
  std::string names[kStageCount];
};

enum class BackendKind {
  Reference,  // the scalar oracle: every stage on any ISA, nothing to build
  Aot,        // kernels compiled into the binary for every Highway target
  Jit,        // kernels built at load time; may leave stages to its fallback
};

struct Backend {
  const char* name;  // as --backend spells it
  BackendKind kind;
  // The backend that serves the stages this one leaves null, and the
  // requests it cannot serve here; nullptr for the reference, which serves
  // every stage everywhere.
  const char* fallback;
  // False when this binary was configured without it (llvm without
  // -DG3ATTN_WITH_LLVM); it then always says why it is unavailable.
  bool in_build;
  // "" when the backend can serve (key, isa) on this machine, else why not.
  // `isa` is resolved (isa.h); for a JIT it is a cap, not a demand.
  std::string (*why_unavailable)(const KernelKey& key, const std::string& isa);
  // Its kernels for (key, isa), built afresh; InputError when it cannot.
  BackendKernels (*build)(const KernelKey& key, const std::string& isa);
  // A JIT with an on-disk object cache: objects this process compiled and
  // objects it loaded from the cache instead. Null for the others.
  int (*compiles)();
  int (*cache_hits)();
};

// Every backend, in the order --backend and bench list them: the reference,
// the AOT kernels, then the JITs.
const std::vector<Backend>& backends();
// The entry named `name`, or nullptr ("auto" is a rule, not an entry).
const Backend* find_backend(const std::string& name);
// The backend `auto` takes for a key, phase and ISA cap without a tune
// profile (the rule and its reason are in backends.cc).
const Backend& auto_backend(const KernelKey& key, Phase phase, const std::string& isa);

}  // namespace g3
