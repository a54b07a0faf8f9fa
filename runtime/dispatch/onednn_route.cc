#include "runtime/dispatch/onednn_route.h"

#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "generator/errors.h"
#include "generator/xbyak/amx_permission.h"
#include "runtime/dispatch/onednn_matmul.h"

namespace g3 {

const char* to_string(ProjProvider p) { return p == ProjProvider::Onednn ? "onednn" : "highway"; }

const char* to_string(ProjectionRoute r) {
  switch (r) {
    case ProjectionRoute::Highway:
      return "highway";
    case ProjectionRoute::Onednn:
      return "onednn";
    default:
      return "auto";
  }
}

ProjectionRoute parse_projection_route(const std::string& name, const std::string& flag) {
  if (name == "auto") return ProjectionRoute::Auto;
  if (name == "highway") return ProjectionRoute::Highway;
  if (name == "onednn") return ProjectionRoute::Onednn;
  throw InputError(flag + ": unknown projection provider '" + name + "' (valid: highway, onednn, auto)");
}

namespace {

struct Entry {
  ProjProvider provider;
  std::string source;
};

std::mutex g_mu;
std::map<std::pair<Phase, DType>, Entry> g_set;  // entries set over the default rule

// Whether oneDNN can serve a compute mode here, asked once per mode.
const std::string& onednn_reason(DType compute) {
  static std::once_flag once[2];
  static std::string reason[2];
  const int i = compute == DType::BF16 ? 1 : 0;
  std::call_once(once[i], [&] { reason[i] = onednn_unavailable_reason(compute); });
  return reason[i];
}

}  // namespace

ProjProvider default_projection_provider(Phase phase, DType compute) {
  // Measured on Emerald Rapids (onednn_route.h): oneDNN wins only for
  // prefill-sized bf16 calls, and only because it runs them on AMX tiles.
  if (phase == Phase::Prefill && compute == DType::BF16 && amx::unavailable_reason().empty())
    return ProjProvider::Onednn;
  return ProjProvider::Highway;
}

ProjProvider projection_provider(Phase phase, DType compute) {
  (void)active_profile();  // its projection entries, once, before the table is read
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_set.find({phase, compute});
    if (it != g_set.end()) return it->second.provider;
  }
  return default_projection_provider(phase, compute);
}

void set_projection_provider(Phase phase, DType compute, ProjProvider p, const std::string& source) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_set[{phase, compute}] = Entry{p, source};
}

void reset_projection_providers() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_set.clear();
}

std::string projection_provider_source(Phase phase, DType compute) {
  (void)active_profile();
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_set.find({phase, compute});
  return it == g_set.end() ? "default rule" : it->second.source;
}

ProjectionChoice explain_projection(ProjectionRoute request, Phase phase, DType compute,
                                    const std::string& gemm_backend, bool isa_capped) {
  if (request == ProjectionRoute::Highway) return {ProjProvider::Highway, "--proj highway"};
  if (request == ProjectionRoute::Onednn) {
    // Both would be silent substitutions: the reference is the oracle and
    // runs its own GEMM, and oneDNN picks its ISA itself, above any cap.
    if (gemm_backend == "reference")
      throw InputError("--proj onednn: the reference backend runs its own GEMM (it is the oracle); "
                       "use --proj highway or auto with it");
    if (isa_capped)
      throw InputError("--proj onednn: oneDNN picks its own ISA and would not honour the --isa cap; "
                       "use --proj highway or auto with a capped ISA");
    const std::string& why = onednn_reason(compute);
    if (!why.empty()) throw InputError("--proj onednn: " + why);
    return {ProjProvider::Onednn, "--proj onednn"};
  }
  if (gemm_backend == "reference") return {ProjProvider::Highway, "auto keeps the reference's own GEMM"};
  if (isa_capped) return {ProjProvider::Highway, "auto keeps Highway under an --isa cap (oneDNN would ignore it)"};
  // The profile, when there is one, sets the table before it is read.
  const ProjProvider p = projection_provider(phase, compute);
  const std::string source = projection_provider_source(phase, compute);
  if (p == ProjProvider::Onednn && !onednn_reason(compute).empty())
    return {ProjProvider::Highway, source + " said onednn, but " + onednn_reason(compute)};
  return {p, source};
}

ProjProvider resolve_projection(ProjectionRoute request, Phase phase, DType compute, const std::string& gemm_backend,
                                bool isa_capped) {
  return explain_projection(request, phase, compute, gemm_backend, isa_capped).provider;
}

std::string projection_rule_text() {
  return "auto (the default) runs prefill-sized calls (more than " + std::to_string(kProjDecodeMaxRows) +
         " rows) of the bf16 compute mode on oneDNN where this process may use AMX tiles, everything else "
         "(f32 compute, decode-sized calls) on Highway, as measured on Emerald Rapids; a tune profile "
         "(`g3attn tune`) replaces it per phase and compute mode with what it measured on this CPU; auto keeps the reference's GEMM and the Highway GEMM under "
         "an --isa cap below the best";
}

}  // namespace g3
