// The per-ISA, per-backend bench harness behind `g3attn bench`: it builds the
// shapes asked for, prepares each model's layer with each backend's kernels
// for each ISA, times the runtime's own stage calls on the runtime's KV
// caches and thread pool (bench.cc), and returns one row per (backend, ISA,
// model, layer kind, phase, context, KV dtype), next to this machine's peaks
// measured in the same run.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "generator/kernel_key.h"
#include "runtime/bench/peaks.h"
#include "runtime/dispatch/backends.h"

namespace g3::bench {

// Defaults (documented in `g3attn bench --help`).
inline constexpr int64_t kDefaultNewTokens = 512;
inline constexpr int kDefaultRepeat = 5;
// A row with the default --repeat stops taking runs once its timed runs
// exceed this many seconds (at least one run is always taken).
inline constexpr double kRowSeconds = 0.5;
// A row with the default --repeat whose runs are short keeps taking them
// (up to kMaxRepeat) until they add up to this many seconds: five runs of a
// 10-microsecond decode row move by a quarter from one bench to the next on
// a shared machine. Cold-cache rows do not (each run costs an eviction).
inline constexpr double kMinRowSeconds = 0.05;
inline constexpr int kMaxRepeat = 2000;
// Cold-cache rows with the default --repeat take this many runs instead of
// kDefaultRepeat: the medians of five cold runs of 1B's and 4B's decode
// rows put a different core first from one bench to the next (up to 1.5x
// apart, AMD EPYC Zen 5); with 11 runs, three benches agreed on every shape
// but one 2% tie. Each run costs an eviction (about 12 ms there).
inline constexpr int kDefaultColdRepeat = 11;
// A row predicted to need more than this per run is skipped with a note:
// always for the reference backend, and for every backend when the contexts
// are the defaults (so the default run stays short).
inline constexpr double kRunBudgetSeconds = 1.5;
// With the default contexts and --repeat, and no budget_seconds, rows take
// no further runs (each keeps the ones it has, at least one) after this many
// seconds, so a loaded machine still finishes the default run in about two
// minutes.
inline constexpr double kDefaultRunSeconds = 80;
const std::vector<int64_t>& default_prefill_contexts();  // prefill and block
const std::vector<int64_t>& default_decode_contexts();   // decode and 1-token block
const std::vector<std::string>& phase_names();           // prefill decode block projections

struct Options {
  std::vector<std::string> models = {"1b", "4b"};  // built-in sizes
  std::vector<std::string> isas;                   // resolved names, lowest first; may include unrunnable ones
  std::vector<std::string> backends = {"reference", "highway", "llvm", "xbyak"};
  std::vector<std::string> phases = {"prefill", "decode"};
  int64_t new_tokens = kDefaultNewTokens;
  std::vector<int64_t> contexts;  // empty: the defaults above, per phase
  int batch = 1;
  int threads = 0;                // 0: every core
  int repeat = 0;                 // 0: kDefaultRepeat, shortened by kRowSeconds
  std::vector<DType> kv_dtypes = {DType::F32};
  std::vector<DType> computes = {DType::F32};     // compute modes (kernel_key.h)
  DType weight_dtype = DType::BF16;
  // Projection providers (onednn_route.h) of projections and block rows:
  // highway, onednn, auto. Empty: projections rows run highway and onednn,
  // block rows auto (the layer's route).
  std::vector<std::string> projs;
  bool progress = false;          // one line per row on stderr while running
  double budget_seconds = 0;      // > 0: rows that would start after this many seconds are skipped (noted)
  // The default run's limits (a row predicted over kRunBudgetSeconds is
  // skipped, rows stop taking runs after kDefaultRunSeconds unless
  // budget_seconds is set) apply when contexts is empty, and always to the
  // reference. A caller that must measure every candidate within its own
  // budget (tune's projections) turns them off.
  bool default_run_limits = true;
};

struct Row {
  std::string backend, isa, model, kind, phase, kv_dtype, weight_dtype;
  std::string compute = "f32";  // the compute mode
  std::string key;              // the kernel key (KernelKey::str()) of the row's layer
  std::string isa_cap;          // the ISA asked for (`isa` is what the code targets: a JIT may cap lower)
  // The backend that ran the attention core: equal to `backend`, except for
  // backend "auto", whose route is the backend the auto rule chose for this
  // row's kernel key and ISA.
  std::string route;
  // `backend`, or "auto(<route>)" for auto rows: the name tables, CSV and
  // charts show.
  std::string label() const;
  // Projections and block rows: the projection provider asked for
  // (highway, onednn or auto) and the one that ran the row's calls; empty
  // on attention-core rows. proj_label() is "auto(onednn)" for auto, the
  // provider otherwise, "-" on core rows.
  std::string proj, proj_route;
  std::string proj_label() const;
  int batch = 1;
  int64_t new_tokens = 0;
  std::optional<int64_t> context;  // empty for projections (no keys)
  double ms_median = 0, ms_min = 0;
  double gflops = 0;
  std::optional<double> gbs;       // K/V bytes read per second, decode rows only
  double pct_peak = 0;             // of the fp32 FMA peak, or of DRAM read for decode rows
  std::optional<double> vs_reference;  // reference time / this time, same shape
  std::optional<double> vs_best;       // best time of the shape / this time (1 = best)
  // Extra detail for JSON readers.
  int runs = 0;
  // When its timed runs began and ended, in seconds since the bench
  // started: a shape's rows are timed round-robin, so theirs overlap.
  double timed_from_s = 0, timed_to_s = 0;
  double flops = 0, kv_bytes = 0;
  bool specialised = true;
  StageBackends stages;           // backend of each stage
  // Block rows: wall ms of each stage of the block call (BlockStageTimes'
  // names, in order) in the row's median run.
  std::vector<std::pair<std::string, double>> stage_ms;
  // Everything but backend and ISA: rows with equal shape_id compete.
  std::string shape_id() const;
  // shape_id plus backend, ISA and projection provider: how --compare
  // matches rows.
  std::string match_id() const;
};

struct Result {
  Options options;                 // as run (threads and contexts resolved)
  Peaks peaks;
  std::vector<Row> rows;
  // Copies of rows, each under another requested ISA cap that runs the
  // same code (a JIT capped lower: xbyak under avx3_dl runs avx3 code). Not
  // shown, since that code was measured once, but `g3attn tune` counts them
  // as candidates of their cap.
  std::vector<Row> same_code;
  std::vector<std::string> notes;  // skips and caveats, each once
  std::vector<std::string> isas_runnable, isas_compiled, backends_built;
  double seconds = 0;              // wall time of the whole run
};

// Validates what the options can be checked for before anything runs
// (InputError with one line), then measures the peaks and every row.
void validate(const Options& o);
Result run_bench(Options o);

// The median of a set of figures (the mean of the middle two of an even
// count): a row's time over its runs, and tune's figures over its passes.
double median(std::vector<double> v);

}  // namespace g3::bench
