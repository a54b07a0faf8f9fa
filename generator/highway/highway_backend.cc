// The Highway AOT backend's entry points (generator/backend_api.h): a kernel
// table for (key, ISA), specialised when g3attn-gen generated the key at build
// time, else the generic kernel of the same templates. The runtime calls this
// once per layer (one dynamic dispatch at the top); the functions it hands
// out call only same-target code below them.
#include "generator/backend_api.h"
#include "generator/errors.h"
#include "generator/highway/emitter.h"
#include "generator/highway/projections.h"
#include "generator/isa.h"
#include "templates/attention_registry.h"

namespace g3 {
namespace generic {
const g3_hwy_target_kernels* Targets(int* count);
}  // namespace generic

namespace {

const g3_hwy_target_kernels* find_target(const g3_hwy_target_kernels* t, int n, const std::string& isa) {
  for (int i = 0; i < n; ++i)
    if (isa == t[i].isa) return &t[i];
  return nullptr;
}

}  // namespace

std::vector<std::string> highway_compiled_isas() {
  int n = 0;
  const g3_hwy_target_kernels* t = generic::Targets(&n);
  std::vector<std::string> v;
  // isa_names() is lowest first; keep that order.
  for (const auto& name : isa_names())
    if (find_target(t, n, name)) v.push_back(name);
  return v;
}

BackendKernels highway_kernels(const KernelKey& key, const std::string& isa) {
  int n = 0;
  const g3_hwy_target_kernels* gen = generic::Targets(&n);
  const g3_hwy_target_kernels* tg = find_target(gen, n, isa);
  if (!tg) throw InputError("highway backend: ISA '" + isa + "' is not compiled into this build");
  if (!target_runs_here(tg->target))
    throw InputError("highway backend: this CPU does not support ISA '" + isa + "'");

  BackendKernels k;
  k.isa = isa;
  k.specialised = false;
  k.table.qk = tg->qk;
  k.table.core = tg->core;
  const std::string ks = hwygen::attention_key(key);
  for (int i = 0; i < g3_hwy_key_count; ++i) {
    if (ks != g3_hwy_keys[i].key) continue;
    int m = 0;
    const g3_hwy_target_kernels* t = g3_hwy_keys[i].targets(&m);
    if (const g3_hwy_target_kernels* s = find_target(t, m, isa)) {
      k.table.qk = s->qk;
      k.table.core = s->core;
      k.specialised = true;
    }
    break;
  }
  if (!k.specialised) k.note = "no kernel generated at build time for key " + ks + ": generic Highway kernel";
  k.table.gemm = highway_gemm(isa);
  k.table.rmsnorm = highway_rmsnorm(isa);
  return k;
}

}  // namespace g3
