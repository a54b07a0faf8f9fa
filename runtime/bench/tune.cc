#include "runtime/bench/tune.h"

#include <algorithm>
#include <map>

#include "generator/errors.h"
#include "runtime/dispatch/backends.h"
#include "runtime/dispatch/isa.h"

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

  r.path = profile_path();
  if (r.path.empty())
    throw InputError("no cache directory for the profile: set G3ATTN_CACHE_DIR (or XDG_CACHE_HOME or HOME)");
  r.profile.version = g3attn_version();
  r.profile.cpu = this_cpu().id();
  r.profile.threads = r.bench.options.threads;
  r.profile.entries = entries_from_rows(r.bench.rows);
  // Keep what an earlier valid profile of this CPU measured and this run
  // did not (other models, ISAs, dtypes).
  if (const Profile* old = active_profile())
    for (const ProfileEntry& e : old->entries)
      if (!r.profile.find(e.key, e.phase, e.isa)) r.profile.entries.push_back(e);
  save_profile(r.profile, r.path);
  return r;
}

}  // namespace g3::bench
