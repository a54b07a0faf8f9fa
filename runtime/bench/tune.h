// `g3attn tune` as a library call: for each kernel key of the given models,
// every backend this build and CPU can run is measured on the shapes of the
// bench's default prefill and decode rows (the runtime's attention core on
// its KV caches and thread pool, runtime/bench/bench.h), on each ISA cap
// asked for; the fastest per (key, phase, ISA) goes into this CPU's profile
// (runtime/dispatch/profile.h), which `auto` then follows. The projections
// are measured too, per provider (highway, onednn: onednn_route.h), on the
// bench's projections rows (N new tokens: prefill; 1 token: decode) for
// each model and compute mode; the faster per (phase, compute mode) becomes
// what --proj auto runs.
#pragma once
#include <string>
#include <vector>

#include "generator/kernel_key.h"
#include "runtime/bench/bench.h"
#include "runtime/dispatch/profile.h"

namespace g3::bench {

struct TuneOptions {
  std::vector<std::string> models = {"1b", "4b"};
  std::vector<std::string> isas;             // resolved names, the best measured first; empty: the best one here
  // Both KV types by default: a bf16 cache is a run option, its kernel keys
  // are keys of their own, and a key tune did not measure keeps the static rule.
  std::vector<DType> kv_dtypes = {DType::F32, DType::BF16};
  std::vector<DType> computes = {DType::F32};
  int threads = 0;                           // 0: every core
  double budget_seconds = 300;               // shapes and caps not reached in time keep the static rule
  // Passes over every row, compared pass by pass (entries_from_passes): on
  // a shared machine a neighbour slows every row it overlaps, sometimes by
  // 3x for a minute (AMD EPYC Zen 5, 2 cores), but the bench times a
  // shape's rows side by side, so within a pass they are slowed alike.
  int rounds = 3;
  bool progress = false;
};

struct TuneResult {
  Profile profile;
  Result bench;        // the first pass's rows (attention cores, then projections), every pass's notes
  std::string path;    // where the profile was written
};

// Measures and writes the profile (merged with the entries of an existing
// valid profile of this CPU that this run did not measure).
TuneResult run_tune(const TuneOptions& o);

// The profile entries that passes of bench rows imply: per (key, phase,
// ISA), the backend with the lowest sum over contexts of its time relative
// to the fastest row of the same context in the same pass (the median over
// the passes that measured it); on global layers, also each backend's median
// time at each context (ProfileEntry::ms_at); and the entry's tie: the
// median over its (context, backend) pairs of how far the pair's relative
// times disagreed between passes (slowest / fastest - 1), at least
// kContextTie. Leaving the static rule, or switching by context, needs a
// gain above that (profile_choice, context_routes): on an AMD EPYC Zen 5,
// tune sent 1B's global prefill over 1024 positions to xbyak, 1.05x ahead
// there, which two benches then timed at 1.08x and 1.11x Highway's.
// Each row's own pass is the only fair comparison: the fastest pass of each
// row taken apart (the rule before) let a row that one quiet moment
// favoured win; on an AMD EPYC Zen 5, auto then ran xbyak's 4B local decode
// core, 3% ahead in tune, at 1.1-1.25x Highway's time in two later benches.
std::vector<ProfileEntry> entries_from_passes(const std::vector<std::vector<Row>>& passes);

// The projection entries a set of bench rows implies (projections rows with
// proj highway or onednn; the others are ignored): per (phase, compute
// mode), the provider with the lowest sum over the models of its time
// relative to the fastest provider of each model's shape; a provider
// missing a shape is not a candidate, and a (phase, compute mode) with
// fewer than two candidates gets no entry (the default rule stays).
std::vector<ProjectionEntry> projection_entries_from_rows(const std::vector<Row>& rows);

}  // namespace g3::bench
