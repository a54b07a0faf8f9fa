// Measured routing for `auto`: a tune profile of this CPU (`g3attn tune`
// writes it, runtime/bench/tune.h) says, for each kernel key, phase and ISA
// cap, which backend was fastest here and by how much. A speed rule measured
// on one CPU does not transfer to another (vdpbf16ps is twice the fp32 peak
// on Zen 4 and half of it on Emerald Rapids), so the profile is keyed by the
// CPU's identity and g3attn's version, and `auto` falls back to the static
// rule (backends.cc auto_backend) without a matching one.
//
// The file: <cache dir>/tune-<16 hex digits of the CPU identity's hash>.json
// (the cache directory of the LLVM objects: $G3ATTN_CACHE_DIR, else
// $XDG_CACHE_HOME/g3attn, else ~/.cache/g3attn):
//   {"format": 2, "g3attn_version": "...", "cpu": {...}, "threads": N,
//    "entries": [{"key", "phase": "prefill"|"decode", "isa", "best",
//                 "ms": {backend: ms, ...}, "rel": {backend: score, ...},
//                 "ms_at": {"<context>": {backend: ms, ...}, ...},
//                 "tie": fraction}],
//    "projections": [...], "decode_prefetch": {...}}  (both optional, below)
// ("ms_at" and "tie" are optional; format 1 kept only each context's
// winner, which cannot place a switch between contexts, so it counts as
// stale.)
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "generator/kernel_key.h"

namespace g3 {

// A block call's shape class: prefill (many query rows) or decode (a few).
enum class Phase { Prefill, Decode };
const char* to_string(Phase p);  // "prefill" | "decode"

// What a profile is valid for: the CPU (vendor, family/model/stepping as
// CPUID reports them, the ISA features routing depends on) and the version.
struct CpuIdentity {
  std::string vendor, model_name, features;
  int family = 0, model = 0, stepping = 0;
  std::string id() const;  // one line naming all of the above
};
const CpuIdentity& this_cpu();
std::string g3attn_version();

// The least gain that makes a route by context, on a profile that does not
// say its own (ProfileEntry::tie).
constexpr double kContextTie = 0.05;

struct ProfileEntry {
  std::string key, isa;
  Phase phase = Phase::Prefill;
  std::string best;                   // the fastest backend
  // Per backend measured: the sum over the contexts of the phase of its
  // median ms, and of its time relative to the fastest of each context (the
  // score the choice minimises: every context counts alike).
  std::map<std::string, double> ms, rel;
  double margin() const;              // runner-up rel / best rel - 1 (0 with one backend)
  // Each backend's median ms at each context measured. The winner can
  // change with the context: a decode over 4096 positions reads K/V from
  // the last-level cache, one over 32768 from DRAM, and the kernels that
  // win the first need not win the second. Where the contexts disagree by
  // more than the entry's tie, auto routes calls by context (context_routes
  // below) around its choice over all of them (profile_choice).
  std::map<int64_t, std::map<std::string, double>> ms_at;
  // How far tune's own passes disagreed on this entry (bench/tune.h,
  // entries_from_passes), at least kContextTie: the least gain that moves
  // auto away from the static rule (profile_choice) and, at one context,
  // away from the choice (context_routes).
  double tie = kContextTie;
};

// The backend auto runs for an entry whose static-rule backend is `rule`:
// the entry's best, unless `rule` was measured (at every context) within
// the entry's tie of it. A smaller lead is inside the noise of tune's own
// passes, and the static rule is what every CPU without a profile runs: on
// an AMD EPYC Zen 5, two tunes chose LLVM for 1B's local decode under avx3
// by 2-3%, and four benches then timed Highway 1.12-1.33x faster.
std::string profile_choice(const ProfileEntry& e, const std::string& rule);

// Which projection provider (onednn_route.h: "highway" or "onednn") was
// fastest for a phase and compute mode: the sum over the models measured of
// each provider's median ms, and of its time relative to the fastest of
// each model (the score the choice minimises).
struct ProjectionEntry {
  Phase phase = Phase::Prefill;
  DType compute = DType::F32;
  std::string best;
  std::map<std::string, double> ms, rel;
  double margin() const;  // runner-up rel / best rel - 1 (0 with one provider)
};

// The decode cores' prefetch (prefetch_route.h) tune measured: the
// candidates' (DecodePrefetch::str()) summed time relative to the fastest
// of each decode row, and the one auto's calls use.
struct PrefetchEntry {
  std::string best;
  std::map<std::string, double> ms, rel;
  double gain() const;  // the default's rel / best's rel - 1 (0 when the default is best or missing)
};

struct Profile {
  int format = 2;
  std::string version, cpu;  // g3attn_version(), this_cpu().id() when written
  int threads = 0;
  std::vector<ProfileEntry> entries;
  // Optional in the file ("projections": [{"phase", "compute", "best",
  // "ms", "rel"}]); loading the active profile hands them to
  // set_projection_provider, so --proj auto follows them.
  std::vector<ProjectionEntry> projections;
  // Optional in the file ("decode_prefetch": {"best", "ms", "rel"});
  // loading the active profile hands `best` to set_decode_prefetch.
  std::optional<PrefetchEntry> prefetch;
  const ProfileEntry* find(const std::string& key, Phase phase, const std::string& isa) const;
  const ProjectionEntry* find_projection(Phase phase, DType compute) const;
};

// Where this CPU's profile lives ("" when no cache directory is known).
std::string profile_path();
// Writes atomically (InputError when the directory cannot be written).
void save_profile(const Profile& p, const std::string& path);
// Parses a profile file; InputError naming the file when it is not one.
Profile load_profile(const std::string& path);

// This CPU's profile for this version, read once per process; null when
// there is none. A corrupt, foreign or stale file prints one warning on
// stderr and counts as none.
const Profile* active_profile();

// What auto runs for (key, phase, ISA cap), and where the choice came from:
// the profile ("profile: xbyak, 1.12x the next") or the static rule.
struct AutoRoute {
  std::string backend, source;
  bool from_profile = false;
};
AutoRoute auto_route(const KernelKey& key, Phase phase, const std::string& isa);

// Where auto's choice for (key, phase, ISA cap) changes with the context,
// each choice with the smallest context it serves, in rising order; empty
// when one backend serves every context. At each measured context the
// entry's choice (profile_choice) keeps the call unless a backend that can
// serve it was more than the entry's `tie` faster there (a smaller gain is
// within this machine's noise, and a wrong switch costs more than it can
// win). Between two neighbouring contexts with different winners the switch
// sits where the log of their time ratio, interpolated in log context,
// crosses zero.
struct ContextRoute {
  int64_t from = 0;
  AutoRoute route;
};
std::vector<ContextRoute> context_routes(const KernelKey& key, Phase phase, const std::string& isa);
// The same for one entry, `servable` saying which backends can run now.
std::vector<ContextRoute> context_routes(const ProfileEntry& e,
                                         const std::function<bool(const std::string&)>& servable);

}  // namespace g3
