#include "runtime/bench/tune.h"

#include <algorithm>
#include <map>

#include "generator/errors.h"
#include "runtime/dispatch/backends.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/onednn_route.h"

namespace g3::bench {

std::vector<ProfileEntry> entries_from_rows(const std::vector<Row>& rows) {
  // The fastest time of every shape (one context of one key, phase, ISA).
  std::map<std::string, double> best;
  // Rows are keyed by the ISA cap asked for: that is what auto looks up.
  auto shape = [](const Row& r) { return r.key + "|" + r.phase + "|" + r.isa_cap + "|" + std::to_string(*r.context); };
  for (const Row& r : rows) {
    if (!r.context || r.key.empty()) continue;
    auto it = best.find(shape(r));
    if (it == best.end() || r.ms_median < it->second) best[shape(r)] = r.ms_median;
  }
  // Per (key, phase, ISA) and backend: the sum of relative times and of ms
  // over the contexts measured; a backend missing a context is not a
  // candidate for that entry.
  struct Acc {
    double rel = 0, ms = 0;
    int n = 0;
  };
  std::map<std::string, std::map<std::string, Acc>> acc;
  std::map<std::string, int> contexts;
  std::map<std::string, ProfileEntry> proto;
  for (const Row& r : rows) {
    if (!r.context || r.key.empty() || r.backend == "auto" || r.backend == "reference") continue;
    const std::string id = r.key + "|" + r.phase + "|" + r.isa_cap;
    Acc& a = acc[id][r.backend];
    a.rel += r.ms_median / best[shape(r)];
    a.ms += r.ms_median;
    ++a.n;
    contexts[id] = std::max(contexts[id], a.n);
    ProfileEntry e;
    e.key = r.key;
    e.isa = r.isa_cap;
    e.phase = r.phase == "decode" ? Phase::Decode : Phase::Prefill;
    proto.emplace(id, e);
  }
  std::vector<ProfileEntry> out;
  for (auto& [id, per] : acc) {
    ProfileEntry e = proto[id];
    double best_rel = 0;
    for (const auto& [backend, a] : per) {
      if (a.n < contexts[id]) continue;
      e.ms[backend] = a.ms;
      e.rel[backend] = a.rel;
      if (e.best.empty() || a.rel < best_rel) e.best = backend, best_rel = a.rel;
    }
    if (!e.best.empty()) out.push_back(e);
  }
  return out;
}

std::vector<ProjectionEntry> projection_entries_from_rows(const std::vector<Row>& rows) {
  // A shape: one model's rows of one size in one compute mode.
  auto phase_of = [](const Row& r) { return projection_phase(int64_t(r.batch) * r.new_tokens); };
  auto id_of = [&](const Row& r) { return std::string(to_string(phase_of(r))) + "|" + r.compute; };
  auto shape = [&](const Row& r) { return id_of(r) + "|" + r.model + "|" + std::to_string(r.new_tokens); };
  auto usable = [](const Row& r) {
    return r.phase == "projections" && (r.proj == "highway" || r.proj == "onednn") && r.proj_route == r.proj;
  };
  std::map<std::string, double> best;
  for (const Row& r : rows) {
    if (!usable(r)) continue;
    auto it = best.find(shape(r));
    if (it == best.end() || r.ms_median < it->second) best[shape(r)] = r.ms_median;
  }
  struct Acc {
    double rel = 0, ms = 0;
    int n = 0;
  };
  std::map<std::string, std::map<std::string, Acc>> acc;
  std::map<std::string, int> shapes;
  std::map<std::string, ProjectionEntry> proto;
  for (const Row& r : rows) {
    if (!usable(r)) continue;
    Acc& a = acc[id_of(r)][r.proj];
    a.rel += r.ms_median / best[shape(r)];
    a.ms += r.ms_median;
    ++a.n;
    shapes[id_of(r)] = std::max(shapes[id_of(r)], a.n);
    ProjectionEntry e;
    e.phase = phase_of(r);
    e.compute = r.compute == "bf16" ? DType::BF16 : DType::F32;
    proto.emplace(id_of(r), e);
  }
  std::vector<ProjectionEntry> out;
  for (auto& [id, per] : acc) {
    ProjectionEntry e = proto[id];
    double best_rel = 0;
    for (const auto& [provider, a] : per) {
      if (a.n < shapes[id]) continue;
      e.ms[provider] = a.ms;
      e.rel[provider] = a.rel;
      if (e.best.empty() || a.rel < best_rel) e.best = provider, best_rel = a.rel;
    }
    // One provider measured is no comparison: the entry would override the
    // default rule with what was never weighed against it.
    if (e.ms.size() >= 2) out.push_back(e);
  }
  return out;
}

TuneResult run_tune(const TuneOptions& t) {
  Options o;
  o.models = t.models;
  o.isas = t.isas.empty() ? std::vector<std::string>{best_isa()} : t.isas;
  // Every backend of the build but the reference (never the fastest, and
  // far too slow for these shapes).
  o.backends.clear();
  for (const Backend& b : backends())
    if (b.in_build && b.kind != BackendKind::Reference) o.backends.push_back(b.name);
  o.phases = {"prefill", "decode"};
  o.kv_dtypes = t.kv_dtypes;
  o.computes = t.computes;
  o.threads = t.threads;
  o.repeat = 3;
  o.progress = t.progress;
  o.budget_seconds = t.budget_seconds;
  TuneResult r;
  r.bench = run_bench(o);

  // The projections, per provider: they do not depend on the attention
  // backend or the KV type, and oneDNN picks its own ISA, so Highway's
  // GEMM on the best ISA is the one other candidate. A share of the budget
  // of its own, so that a long attention run still leaves them measured.
  Options p = o;
  p.backends = {"highway"};
  p.isas = {best_isa()};
  p.phases = {"projections"};
  p.kv_dtypes = {DType::F32};
  p.projs = {"highway", "onednn"};
  p.budget_seconds = std::max(30.0, t.budget_seconds / 2);
  const Result proj = run_bench(p);
  r.bench.rows.insert(r.bench.rows.end(), proj.rows.begin(), proj.rows.end());
  for (const std::string& n : proj.notes)
    if (std::find(r.bench.notes.begin(), r.bench.notes.end(), n) == r.bench.notes.end()) r.bench.notes.push_back(n);

  r.path = profile_path();
  if (r.path.empty())
    throw InputError("no cache directory for the profile: set G3ATTN_CACHE_DIR (or XDG_CACHE_HOME or HOME)");
  r.profile.version = g3attn_version();
  r.profile.cpu = this_cpu().id();
  r.profile.threads = r.bench.options.threads;
  r.profile.entries = entries_from_rows(r.bench.rows);
  r.profile.projections = projection_entries_from_rows(proj.rows);
  // Keep what an earlier valid profile of this CPU measured and this run
  // did not (other models, ISAs, dtypes).
  if (const Profile* old = active_profile())
    for (const ProfileEntry& e : old->entries)
      if (!r.profile.find(e.key, e.phase, e.isa)) r.profile.entries.push_back(e);
  if (const Profile* old = active_profile())
    for (const ProjectionEntry& e : old->projections)
      if (!r.profile.find_projection(e.phase, e.compute)) r.profile.projections.push_back(e);
  save_profile(r.profile, r.path);
  return r;
}

}  // namespace g3::bench
