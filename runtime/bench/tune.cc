#include "runtime/bench/tune.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "generator/errors.h"
#include "runtime/dispatch/backends.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/onednn_route.h"
#include "runtime/dispatch/prefetch_route.h"

namespace g3::bench {

namespace {

struct Sum {
  double rel = 0, ms = 0;  // summed over the entry's shapes, each the median over the passes that measured it
  int n = 0;               // shapes measured
};

// The fastest median of each shape among one pass's rows that `use` keeps.
template <class Use, class Shape>
std::map<std::string, double> fastest_per_shape(const std::vector<Row>& rows, Use use, Shape shape_of) {
  std::map<std::string, double> best;
  for (const Row& r : rows)
    if (use(r)) {
      auto [it, fresh] = best.try_emplace(shape_of(r), r.ms_median);
      if (!fresh) it->second = std::min(it->second, r.ms_median);
    }
  return best;
}

// The choice rule both profile sections share. Rows that `use` keeps are
// grouped into entries (id_of) whose candidates (candidate_of) compete on
// one or more shapes (shape_of: e.g. the contexts of a kernel key). In each
// pass, each candidate's time is taken relative to the fastest row of its
// shape in that pass: the bench times a shape's rows side by side, so a
// busy moment of the machine slows them alike and the ratio holds where
// the times do not. A shape's ratio is the median over the passes that
// measured the candidate (bench.h's median), not the mean: on a shared
// machine one pass can be slowed for one backend's rows alone (a
// neighbour's burst that overlaps them), and over the default three passes
// the median leaves that pass out where the mean carries a third of it.
// With the mean, a tune on an AMD EPYC Zen 5 (2 cores) put LLVM's 4B local
// decode under avx3_dl 1.16x ahead of Highway, and three benches then timed
// Highway 1.15-1.30x faster (that tune's passes were not kept, so which pass
// misled it is not known). The ratios are summed over the shapes, so
// every shape weighs the same whatever its length. A candidate missing a
// shape of its entry is dropped (no fair comparison). `first` keeps, per
// entry, the row its fields come from.
template <class Use, class Id, class Shape, class Candidate>
std::map<std::string, std::map<std::string, Sum>> relative_sums(const std::vector<std::vector<Row>>& passes, Use use,
                                                                Id id_of, Shape shape_of, Candidate candidate_of,
                                                                std::map<std::string, const Row*>& first) {
  struct Acc {
    std::vector<double> rel, ms;  // one per pass that measured the shape
  };
  std::map<std::string, std::map<std::string, std::map<std::string, Acc>>> acc;  // entry -> shape -> candidate
  for (const std::vector<Row>& rows : passes) {
    const std::map<std::string, double> best = fastest_per_shape(rows, use, shape_of);
    for (const Row& r : rows) {
      if (!use(r)) continue;
      Acc& a = acc[id_of(r)][shape_of(r)][candidate_of(r)];
      a.rel.push_back(r.ms_median / best.at(shape_of(r)));
      a.ms.push_back(r.ms_median);
      first.emplace(id_of(r), &r);
    }
  }
  std::map<std::string, std::map<std::string, Sum>> sums;
  for (const auto& [id, shapes] : acc) {
    auto& per = sums[id];
    for (const auto& [shape, by_candidate] : shapes)
      for (const auto& [c, a] : by_candidate) {
        Sum& s = per[c];
        s.rel += median(a.rel);
        s.ms += median(a.ms);
        ++s.n;
      }
    std::erase_if(per, [n = int(shapes.size())](const auto& c) { return c.second.n < n; });
  }
  return sums;
}

// Fills an entry's ms, rel and best (smallest summed relative time).
template <class Entry>
void choose(Entry& e, const std::map<std::string, Sum>& per) {
  double best_rel = 0;
  for (const auto& [name, a] : per) {
    e.ms[name] = a.ms;
    e.rel[name] = a.rel;
    if (e.best.empty() || a.rel < best_rel) e.best = name, best_rel = a.rel;
  }
}

}  // namespace

std::vector<ProfileEntry> entries_from_passes(const std::vector<std::vector<Row>>& passes) {
  // Entries per (key, phase, ISA cap asked for: what auto looks up), the
  // backends competing on each context; the reference and auto rows are no
  // candidates.
  auto use = [](const Row& r) {
    return r.context && !r.key.empty() && r.backend != "auto" && r.backend != "reference";
  };
  auto id_of = [](const Row& r) { return r.key + "|" + r.phase + "|" + r.isa_cap; };
  auto shape_of = [&](const Row& r) { return id_of(r) + "|" + std::to_string(*r.context); };
  std::map<std::string, const Row*> first;
  const auto sums = relative_sums(passes, use, id_of, shape_of, [](const Row& r) { return r.backend; }, first);
  // Each kept candidate's time at each context (the median over its
  // passes). Not on local layers: past the window their calls do the same
  // work at every context, so a route by context would only follow the
  // noise. On every layer, each one's time relative to the fastest of its
  // context in each pass, for the entry's tie.
  std::map<std::string, std::map<int64_t, std::map<std::string, std::vector<double>>>> ms_passes;
  std::map<std::string, std::map<std::pair<int64_t, std::string>, std::vector<double>>> rel_at;
  for (const std::vector<Row>& rows : passes) {
    const std::map<std::string, double> fastest = fastest_per_shape(rows, use, shape_of);
    for (const Row& r : rows) {
      if (!use(r) || !sums.count(id_of(r)) || !sums.at(id_of(r)).count(r.backend)) continue;
      rel_at[id_of(r)][{*r.context, r.backend}].push_back(r.ms_median / fastest.at(shape_of(r)));
      if (r.kind != "local") ms_passes[id_of(r)][*r.context][r.backend].push_back(r.ms_median);
    }
  }
  std::map<std::string, std::map<int64_t, std::map<std::string, double>>> at;
  for (const auto& [id, by_context] : ms_passes)
    for (const auto& [ctx, per] : by_context)
      for (const auto& [backend, ms] : per) at[id][ctx][backend] = median(ms);
  std::vector<ProfileEntry> out;
  for (const auto& [id, per] : sums) {
    const Row& r = *first.at(id);
    ProfileEntry e;
    e.key = r.key;
    e.isa = r.isa_cap;
    e.phase = r.phase == "decode" ? Phase::Decode : Phase::Prefill;
    choose(e, per);
    e.ms_at = at[id];
    std::vector<double> spread;
    for (const auto& [pair, rel] : rel_at[id])
      if (rel.size() > 1) {
        const auto [lo, hi] = std::minmax_element(rel.begin(), rel.end());
        spread.push_back(*hi / *lo - 1);
      }
    if (!spread.empty()) {
      std::nth_element(spread.begin(), spread.begin() + spread.size() / 2, spread.end());
      e.tie = std::max(kContextTie, spread[spread.size() / 2]);
    }
    if (!e.best.empty()) out.push_back(e);
  }
  return out;
}

std::vector<ProjectionEntry> projection_entries_from_rows(const std::vector<Row>& rows) {
  // Entries per (phase, compute mode), the two providers competing on each
  // model's rows of one size.
  auto phase_of = [](const Row& r) { return projection_phase(int64_t(r.batch) * r.new_tokens); };
  auto use = [](const Row& r) {
    return r.phase == "projections" && (r.proj == "highway" || r.proj == "onednn") && r.proj_route == r.proj;
  };
  auto id_of = [&](const Row& r) { return std::string(to_string(phase_of(r))) + "|" + r.compute; };
  auto shape_of = [&](const Row& r) { return id_of(r) + "|" + r.model + "|" + std::to_string(r.new_tokens); };
  std::map<std::string, const Row*> first;  // points into `one`, which must outlive it
  const std::vector<std::vector<Row>> one = {rows};
  const auto sums = relative_sums(one, use, id_of, shape_of, [](const Row& r) { return r.proj; }, first);
  std::vector<ProjectionEntry> out;
  for (const auto& [id, per] : sums) {
    const Row& r = *first.at(id);
    ProjectionEntry e;
    e.phase = phase_of(r);
    e.compute = r.compute == "bf16" ? DType::BF16 : DType::F32;
    choose(e, per);
    // One provider measured is no comparison: the entry would override the
    // default rule with what was never weighed against it.
    if (e.ms.size() >= 2) out.push_back(e);
  }
  return out;
}

// Tune's budget below which it leaves the decode prefetch unmeasured.
static constexpr double kPrefetchMinBudget = 60;

// The decode cores' prefetch (prefetch_route.h): `d`'s decode rows (Highway,
// the best ISA) under each candidate, the candidates one whole bench run
// after the other and in a rotated order each round, so that a busy minute
// of the machine does not always fall on the same one; per round, each
// row's time relative to its fastest candidate; the candidate with the
// lowest sum over the rows of the median ratio over the rounds wins, and
// leaves the default only by more than kContextTie. Leaves the winner set.
static PrefetchEntry tune_prefetch(Options d, int rounds, double budget, double& spent) {
  const std::vector<DecodePrefetch>& cands = decode_prefetch_candidates();
  std::map<std::string, std::map<std::string, std::vector<double>>> rel, ms;  // candidate -> row -> rounds
  for (int round = 0; round < rounds && spent < budget; ++round) {
    std::map<std::string, std::map<std::string, double>> got;  // row -> candidate -> ms
    for (size_t i = 0; i < cands.size(); ++i) {
      const DecodePrefetch& c = cands[(i + size_t(round)) % cands.size()];
      set_decode_prefetch(c, "tune");
      d.budget_seconds = std::max(1.0, budget - spent);
      const Result r = run_bench(d);
      spent += r.seconds;
      for (const Row& row : r.rows)
        if (row.phase == "decode") got[row.shape_id()][c.str()] = row.ms_median;
    }
    for (const auto& [row, per] : got) {
      if (per.size() != cands.size()) continue;  // the budget ran out within the round
      double fastest = per.begin()->second;
      for (const auto& [c, m] : per) fastest = std::min(fastest, m);
      for (const auto& [c, m] : per) {
        rel[c][row].push_back(m / fastest);
        ms[c][row].push_back(m);
      }
    }
  }
  PrefetchEntry e;
  for (const auto& [c, rows] : rel)
    for (const auto& [row, v] : rows) {
      e.rel[c] += median(v);
      e.ms[c] += median(ms[c][row]);
    }
  e.best = DecodePrefetch{}.str();
  if (e.rel.count(e.best)) {  // a whole round was measured
    for (const auto& [c, r] : e.rel)
      if (r < e.rel.at(e.best)) e.best = c;
    if (e.gain() <= kContextTie) e.best = DecodePrefetch{}.str();
  }
  set_decode_prefetch(parse_decode_prefetch(e.best, "tune"), "tune");
  return e;
}

// Notes of a later bench run that the first did not give (each once).
static void add_new_notes(std::vector<std::string>& notes, const std::vector<std::string>& more) {
  for (const std::string& n : more)
    if (std::find(notes.begin(), notes.end(), n) == notes.end()) notes.push_back(n);
}

TuneResult run_tune(const TuneOptions& t) {
  Options o;
  o.models = t.models;
  // Every backend of the build but the reference (never the fastest, and
  // far too slow for these shapes).
  o.backends.clear();
  for (const Backend& b : backends())
    if (b.in_build && b.kind != BackendKind::Reference) o.backends.push_back(b.name);
  o.phases = {"prefill", "decode"};
  o.kv_dtypes = t.kv_dtypes;
  o.computes = t.computes;
  o.threads = t.threads;
  o.repeat = 0;  // the bench's default: short rows take runs until they add up to 50 ms
  o.progress = t.progress;
  const double total = t.budget_seconds;
  double spent = 0;
  // The decode prefetch first, so that the backends' decode rows below run
  // with it, within a quarter of the budget; a budget under a minute is
  // spent on the backends alone (a round of the candidates takes several
  // seconds, and the backends are the larger part). Loading this CPU's old
  // profile now keeps its setting from replacing the candidates later
  // (prefetch_route.h).
  active_profile();
  std::optional<PrefetchEntry> prefetch;
  std::vector<std::string> prefetch_notes;
  if (total < kPrefetchMinBudget) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "a budget under %.0f s leaves the decode prefetch unmeasured: the cores keep their default "
                  "(or an earlier profile's setting)",
                  kPrefetchMinBudget);
    prefetch_notes.push_back(buf);
  } else {
    Options d = o;
    d.backends = {"highway"};
    d.isas = {best_isa()};
    d.phases = {"decode"};
    // The longest default context only: a local layer's rows are the same
    // at every context, and a global layer's read the most there, where the
    // prefetch matters most; a round then takes a third of the time.
    d.contexts = {default_decode_contexts().back()};
    d.computes = {DType::F32};
    PrefetchEntry e = tune_prefetch(d, t.rounds, total / 4, spent);
    if (!e.rel.empty()) prefetch = e;
  }
  // The cap runs use (the best ISA) is measured first, in passes of its
  // own, then the other caps: a budget that runs out leaves the lower caps,
  // not the one runs take, on the static rule.
  std::vector<std::vector<std::string>> groups;
  const std::vector<std::string> isas = t.isas.empty() ? std::vector<std::string>{best_isa()} : t.isas;
  if (std::find(isas.begin(), isas.end(), best_isa()) != isas.end()) groups.push_back({best_isa()});
  std::vector<std::string> rest;
  for (const std::string& i : isas)
    if (i != best_isa()) rest.push_back(i);
  if (!rest.empty()) groups.push_back(rest);
  TuneResult r;
  std::vector<std::vector<Row>> passes;  // every pass's rows and same-code rows, for the choice
  auto keep_pass = [&passes](const Result& b) {
    passes.push_back(b.rows);
    passes.back().insert(passes.back().end(), b.same_code.begin(), b.same_code.end());
  };
  for (size_t g = 0; g < groups.size(); ++g) {
    if (g > 0 && spent >= total) {
      std::string names;
      for (const std::string& i : groups[g]) names += (names.empty() ? "" : ",") + i;
      r.bench.notes.push_back("the time budget ran out before ISA caps " + names + ": auto keeps the static rule there");
      break;
    }
    o.isas = groups[g];
    o.budget_seconds = std::max(1.0, total - spent);
    Result got = run_bench(o);
    spent += got.seconds;
    keep_pass(got);
    // Later passes while the budget lasts; r.bench keeps the first's rows.
    for (int pass = 1; pass < t.rounds && spent < total; ++pass) {
      o.budget_seconds = total - spent;
      const Result again = run_bench(o);
      spent += again.seconds;
      keep_pass(again);
      add_new_notes(got.notes, again.notes);
    }
    if (g == 0) {
      r.bench = std::move(got);
      add_new_notes(r.bench.notes, prefetch_notes);
      continue;
    }
    r.bench.rows.insert(r.bench.rows.end(), got.rows.begin(), got.rows.end());
    r.bench.same_code.insert(r.bench.same_code.end(), got.same_code.begin(), got.same_code.end());
    add_new_notes(r.bench.notes, got.notes);
    r.bench.options.isas.insert(r.bench.options.isas.end(), got.options.isas.begin(), got.options.isas.end());
  }
  o.budget_seconds = total;

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
  // Both providers of every shape, or the entry has nothing to compare: the
  // bench's per-row limit would drop a provider slower than it (Highway's
  // GEMM under a sanitizer, say); this budget bounds the rows instead.
  p.default_run_limits = false;
  const Result proj = run_bench(p);
  r.bench.rows.insert(r.bench.rows.end(), proj.rows.begin(), proj.rows.end());
  add_new_notes(r.bench.notes, proj.notes);

  r.path = profile_path();
  if (r.path.empty())
    throw InputError("no cache directory for the profile: set G3ATTN_CACHE_DIR (or XDG_CACHE_HOME or HOME)");
  r.profile.version = g3attn_version();
  r.profile.cpu = this_cpu().id();
  r.profile.threads = r.bench.options.threads;
  r.profile.entries = entries_from_passes(passes);
  r.profile.projections = projection_entries_from_rows(proj.rows);
  // Keep what an earlier valid profile of this CPU measured and this run
  // did not (other models, ISAs, dtypes).
  if (const Profile* old = active_profile())
    for (const ProfileEntry& e : old->entries)
      if (!r.profile.find(e.key, e.phase, e.isa)) r.profile.entries.push_back(e);
  if (const Profile* old = active_profile())
    for (const ProjectionEntry& e : old->projections)
      if (!r.profile.find_projection(e.phase, e.compute)) r.profile.projections.push_back(e);
  r.profile.prefetch = prefetch;
  if (const Profile* old = active_profile(); old && !prefetch) r.profile.prefetch = old->prefetch;
  save_profile(r.profile, r.path);
  return r;
}

}  // namespace g3::bench
