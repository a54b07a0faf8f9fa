// g3attn tune: measures every backend on this CPU for the kernel keys of the
// given models and writes the profile `auto` follows (runtime/bench/tune.h,
// runtime/dispatch/profile.h).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "generator/catalogue.h"
#include "generator/errors.h"
#include "runtime/bench/tune.h"
#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/prefetch_route.h"

namespace g3::cli {

static std::vector<Option> tune_options() {
  return {
      {"model", Arity::Value, "LIST", "built-in sizes whose kernel keys to measure (default 1b,4b)"},
      {"isa", Arity::Value, "LIST",
       "ISA caps to measure: names, best or all (default $G3ATTN_ISA, else all: every cap this machine and build "
       "run, as bench's default rows do, the best one first)"},
      {"kv-dtype", Arity::Value, "T", "KV cache element types f32|bf16|all (default all)"},
      {"compute", Arity::Value, "MODE", "compute modes f32|bf16|all (default f32)"},
      {"threads", Arity::Value, "N", "threads, as runs will use them (default all cores)"},
      {"budget", Arity::Value, "SECONDS",
       "stop measuring after about this long; keys and ISA caps not reached keep the static rule (default 300)"},
      {"rounds", Arity::Value, "N",
       "passes over every row while the budget lasts; in each, a backend's time is taken relative to the "
       "fastest of the same shape, timed beside it, and each shape takes the median of its ratios over the "
       "passes (default 3)"},
      {"json", Arity::OptionalValue, "FILE", "the profile's entries as JSON on stdout, or the table plus FILE"},
  };
}

int cmd_tune(int argc, char** argv, int first) {
  Args a("tune", tune_options(), argc, argv, first);
  if (a.help()) {
    std::cout << "Usage: g3attn tune [--model LIST] [--isa LIST] [--kv-dtype T] [--compute MODE] [--threads N]\n"
                 "                   [--budget SECONDS] [--rounds N] [--json [FILE]]\n"
                 "Measures, on this CPU, every backend this build can run (highway, llvm, xbyak, amx)\n"
                 "on the attention core of each kernel key of the models, on the shapes of the bench's\n"
                 "default rows (prefill: 512 new tokens over 1024 and 4096 positions; decode: one token\n"
                 "over 4096 and 32768, with cold caches as a decode step runs it), and writes the\n"
                 "fastest per key, phase and ISA into this CPU's profile in the cache directory\n"
                 "($G3ATTN_CACHE_DIR, else $XDG_CACHE_HOME/g3attn, else ~/.cache/g3attn).\n"
                 "--backend auto then routes each layer's prefill and decode calls\n"
                 "to the measured winner, unless the static rule's backend came within the noise this\n"
                 "run's passes showed on that key (the profile's \"tie\", at least 5%); `g3attn plan`\n"
                 "shows the choice and its margin. Where a global layer's winner beats that choice at\n"
                 "some measured context by more than the tie, calls switch backend by context, at the\n"
                 "context where the two backends' measured time ratio crosses 1 (interpolated in log\n"
                 "context); plan lists the ranges. It also measures\n"
                 "the projections (Q/K/V and output, 512 tokens: prefill; 1 token: decode) on Highway's\n"
                 "GEMM and on oneDNN's matmul for each compute mode, and --proj auto then runs the\n"
                 "faster per phase and compute mode instead of the default rule (a layer on oneDNN\n"
                 "keeps oneDNN's copy of its projection weights, in f32 for the f32 mode). Before all\n"
                 "that, it times Highway's decode rows over 32768 positions under each decode prefetch\n"
                 "(default: 8 KiB of K and V ahead into L1; l2:16384 and l2:32768: 16 or 32 KiB ahead\n"
                 "into L2) and keeps the fastest if it beats the default by more than 5% (within a\n"
                 "quarter of --budget, and only with a budget of 60 s or more): every backend's decode\n"
                 "core then follows it (`g3attn plan` shows it). A profile is valid for this CPU\n"
                 "(vendor, family/model, ISA features) and this g3attn version only; entries of an\n"
                 "earlier profile of this CPU that this run does not measure are kept.\n\n"
              << a.usage();
    return 0;
  }
  bench::TuneOptions o;
  o.models = a.list("model", "1b,4b");
  for (const auto& m : o.models) builtin_model(m);  // InputError listing the sizes
  // Without --isa or G3ATTN_ISA, every cap: bench's default rows (and a run
  // under --isa) use them all, and a cap tune did not measure keeps the
  // static rule (Highway's scalar prefill core took twice LLVM's SSE2 code
  // on an AMD EPYC Zen 4).
  const char* env_isa = std::getenv("G3ATTN_ISA");
  const std::string isa = a.has("isa") ? a.str("isa") : env_isa && *env_isa ? requested_isa("") : "all";
  if (isa == "all") {
    o.isas = runnable_isas();
  } else {
    for (const auto& i : a.list("isa", isa)) o.isas.push_back(resolve_isa(requested_isa(i)));
  }
  if (a.has("kv-dtype")) {  // else TuneOptions' default: both
    const std::string kv = a.str("kv-dtype");
    o.kv_dtypes = kv == "all" ? std::vector<DType>{DType::F32, DType::BF16}
                              : std::vector<DType>{parse_dtype(kv, "--kv-dtype")};
  }
  const std::string cm = a.str("compute", "f32");
  o.computes = cm == "all" ? std::vector<DType>{DType::F32, DType::BF16}
                           : std::vector<DType>{parse_dtype(cm, "--compute")};
  o.threads = int(a.integer("threads", 0, 1, 1024));
  o.budget_seconds = double(a.integer("budget", 300, 1, 1 << 20));
  o.rounds = int(a.integer("rounds", 3, 1, 100));
  const bool json_stdout = a.has("json") && a.str("json").empty();
  if (a.has("json") && !json_stdout) check_output_path(a.str("json"), "--json");
  if (profile_path().empty())
    throw InputError("no cache directory for the profile: set G3ATTN_CACHE_DIR (or XDG_CACHE_HOME or HOME)");
  // Before minutes of measurements: the profile's directory is made if
  // missing and must be writable.
  {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(profile_path()).parent_path(), ec);
    try {
      check_output_path(profile_path(), "profile");
    } catch (const InputError& e) {
      throw InputError(std::string(e.what()) + " (set G3ATTN_CACHE_DIR to a writable directory)");
    }
  }
  o.progress = isatty(STDERR_FILENO) != 0;

  const bench::TuneResult r = bench::run_tune(o);
  nlohmann::json j;
  j["profile"] = r.path;
  j["cpu"] = r.profile.cpu;
  j["entries"] = nlohmann::json::array();
  std::vector<std::vector<std::string>> table = {{"key", "phase", "isa", "best", "margin", "ms per backend"}};
  for (const ProfileEntry& e : r.profile.entries) {
    std::string times;
    for (const auto& [b, ms] : e.ms) times += (times.empty() ? "" : ", ") + b + " " + fmt_double(ms, 4);
    table.push_back({e.key, to_string(e.phase), e.isa, e.best, fmt_double(e.margin(), 3), times});
    j["entries"].push_back({{"key", e.key}, {"phase", to_string(e.phase)}, {"isa", e.isa}, {"best", e.best},
                            {"margin", e.margin()}, {"ms", e.ms}});
  }
  j["projections"] = nlohmann::json::array();
  std::vector<std::vector<std::string>> ptable = {{"projections", "compute", "best", "margin", "ms per provider"}};
  for (const ProjectionEntry& e : r.profile.projections) {
    std::string times;
    for (const auto& [p, ms] : e.ms) times += (times.empty() ? "" : ", ") + p + " " + fmt_double(ms, 4);
    ptable.push_back({to_string(e.phase), to_string(e.compute), e.best, fmt_double(e.margin(), 3), times});
    j["projections"].push_back({{"phase", to_string(e.phase)}, {"compute", to_string(e.compute)}, {"best", e.best},
                                {"margin", e.margin()}, {"ms", e.ms}});
  }
  std::string prefetch_line;
  if (const auto& pe = r.profile.prefetch) {
    std::string times;
    for (const auto& [c, ms] : pe->ms) times += (times.empty() ? "" : ", ") + c + " " + fmt_double(ms, 4);
    prefetch_line = "decode prefetch: " + pe->best + " (" + fmt_double(1 + pe->gain(), 3) + "x the default; ms " +
                    times + ")";
    j["decode_prefetch"] = {{"best", pe->best}, {"gain", pe->gain()}, {"ms", pe->ms}, {"rel", pe->rel}};
  }
  for (const auto& n : r.bench.notes) j["notes"].push_back(n);
  if (!json_stdout) {
    std::cout << "profile for " << r.profile.cpu << "\nwritten to " << r.path << "\n";
    std::cout << format_table(table);
    if (ptable.size() > 1) std::cout << format_table(ptable);
    if (!prefetch_line.empty()) std::cout << prefetch_line << "\n";
    for (const auto& n : r.bench.notes) std::cout << "note: " << n << "\n";
  }
  if (a.has("json")) emit_json(a, j.dump(2));
  return 0;
}

}  // namespace g3::cli
