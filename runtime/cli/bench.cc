// g3attn bench: per-ISA, per-backend timings of the attention kernels next
// to this machine's measured peaks; table, JSON, CSV, SVG and --compare.
// The work is in runtime/bench/; this file only parses and prints.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "generator/errors.h"
#include "runtime/bench/bench.h"
#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/dispatch/backends.h"
#include "runtime/dispatch/isa.h"
#include "runtime/io/npy.h"
#include "runtime/report/bench_report.h"

namespace g3::cli {

namespace {

std::string secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

// The time limits of the default run, in the words --help prints.
std::string budget_text() {
  return "Time limits, so the default run stays under two minutes: a row predicted to take more than " +
         secs(bench::kRunBudgetSeconds) +
         " s per run\n(from the same backend/ISA's smaller rows, or a probe) is skipped with a note - always for "
         "the reference,\nand for every backend when --context is not given; with the default --context and "
         "--repeat, rows\ntake no further runs after " +
         secs(bench::kDefaultRunSeconds) + " s (each keeps the ones it has, at least one).\n\n";
}

std::vector<Option> bench_options() {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return {
      {"model", Arity::Value, "LIST", "built-in sizes, comma-separated: 270m,1b,4b,12b,27b (default 1b,4b)"},
      {"isa", Arity::Value, "all|LIST",
       "scalar,ssse3,sse4,avx2,avx3,avx3_dl,best; ones this machine or build cannot run are skipped with a note "
       "(default $G3ATTN_ISA if set, else all)"},
      {"backend", Arity::Value, "all|LIST",
       "reference,highway,llvm,xbyak,amx,auto; ones this build or machine lacks are skipped with a note (amx "
       "rows need --compute bf16 and AMX); auto rows measure "
       "the route --backend auto takes and name it per row: auto(highway) in the table and CSV, backend "
       "\"auto\" plus \"route\" in JSON; an auto row and its route's own row in the same run are one measurement "
       "of that code, shown twice (default all: the five backends, not auto)"},
      {"phase", Arity::Value, "P",
       "prefill|decode|block|projections|all, or a comma list (default prefill,decode)"},
      {"new-tokens", Arity::Value, "N",
       "prefill queries (the last N positions of the context); block and projections also run 1 token "
       "(default " + std::to_string(bench::kDefaultNewTokens) + ")"},
      {"context", Arity::Value, "LIST",
       "key positions, comma-separated (default 1024,4096 for prefill and block, 4096,32768 for decode and "
       "1-token block)"},
      {"batch", Arity::Value, "B", "sequences per call, each with its own cache (default 1)"},
      {"threads", Arity::Value, "N", "threads for the kernels and the peaks (default all cores: " +
                                         std::to_string(cores) + ")"},
      {"repeat", Arity::Value, "N",
       "timed runs per row after one warm-up (default " + std::to_string(bench::kDefaultRepeat) + ", " +
           std::to_string(bench::kDefaultColdRepeat) + " on cold-cache rows, more - up to " +
           std::to_string(bench::kMaxRepeat) + " - until they add up to " +
           secs(bench::kMinRowSeconds) + " s except on cold-cache rows, fewer - at least 1 - once a row's runs pass " +
           secs(bench::kRowSeconds) + " s; an explicit N is always honoured)"},
      {"kv-dtype", Arity::Value, "T", "KV cache element types f32|bf16|all or a comma list (default f32)"},
      {"compute", Arity::Value, "MODE",
       "compute modes f32|bf16|all or a comma list (f32,bf16): rows per mode (default f32; see `g3attn --help`)"},
      {"weight-dtype", Arity::Value, "T", "projection weight type f32|bf16 (default bf16)"},
      {"proj", Arity::Value, "LIST",
       "projection providers of projections and block rows: highway,onednn,auto,all (all: highway,onednn); "
       "auto is the layer's route (see `g3attn plan`), shown as auto(onednn) in the table's proj column and as "
       "\"proj\" plus \"proj_route\" in JSON; onednn rows run once, on the best ISA (oneDNN picks its own); "
       "the reference backend always runs its own GEMM (default: highway,onednn on projections rows, auto on "
       "block rows)"},
      {"json", Arity::OptionalValue, "FILE", "JSON instead of the table on stdout, or the table plus FILE"},
      {"csv", Arity::Value, "FILE", "the rows as CSV"},
      {"svg", Arity::Value, "FILE", "grouped bar chart of % of peak per shape, one bar per backend/ISA"},
      {"compare", Arity::Value, "OLD.json", "time ratios against an earlier --json run of the same rows"},
      {"threshold", Arity::Value, "PCT", "--compare flags rows slower by more than PCT percent (default 10)"},
  };
}

const char* kHelpHead =
    "Usage: g3attn bench [--model 1b,4b,...] [--isa all|LIST] [--backend all|LIST]\n"
    "                    [--phase prefill|decode|block|projections|all] [--new-tokens N]\n"
    "                    [--context 4096,32768,...] [--batch B] [--threads N] [--repeat N]\n"
    "                    [--kv-dtype f32|bf16|all] [--compute f32|bf16|all] [--weight-dtype f32|bf16]\n"
    "                    [--proj highway,onednn,auto|all]\n"
    "                    [--json [FILE]]\n"
    "                    [--csv FILE] [--svg FILE] [--compare OLD.json] [--threshold PCT]\n\n"
    "Measures this machine's peaks first (fp32 FMA GFLOP/s, bf16 vdpbf16ps GFLOP/s where the CPU has\n"
    "AVX512_BF16, bf16 AMX tdpbf16ps GFLOP/s where it has AMX and Linux grants the tiles, DRAM read GB/s;\n"
    "for the thread count used), then one row per backend x ISA x model x layer kind x phase x context x\n"
    "KV dtype x compute mode, and for projections and block rows per projection provider (--proj):\n"
    "  prefill      the attention core for the last N positions of the context against the cache\n"
    "               (causal; the window on local layers)\n"
    "  decode       the attention core for one new token over the context (KV chunks split across\n"
    "               threads and merged by log-sum-exp)\n"
    "  block        the whole block: norms, fused QKV projection, QK-norm + RoPE + cache write, core,\n"
    "               output projection, post-norm; for N tokens and for 1 token; the projections on the\n"
    "               layer's route (auto) unless --proj names providers; JSON's stage_ms gives the wall\n"
    "               ms of each stage (cache_slots, pre_norm, qkv_projection, qk_rope_cache,\n"
    "               attention_core, out_projection, post_norm) in the row's median run\n"
    "  projections  the Q/K/V and output projections alone, for N tokens and for 1 token, per provider:\n"
    "               highway (the kernel table's GEMM/GEMV) and onednn (oneDNN's matmul, AMX where present)\n"
    "Decode-sized rows (decode, and the 1-token block and projections rows) run with cold caches, as a\n"
    "decode step finds a layer after the other layers ran: before each run (untimed) the threads read\n"
    "3x the L3 (at least 64 MiB; 512 MiB where sysfs gives no L3 size), then run the same call on a\n"
    "second layer of the shape (its own weights and K/V), as the layer before it in a step does,\n"
    "which leaves the kernels' code and scratch in cache. So the 1-token block rows of a model's\n"
    "layers add up to what `g3attn run` spends per decode step, and a decode row's GB/s is read\n"
    "from DRAM.\n"
    "Each row: median and minimum ms, GFLOP/s, GB/s of K/V read (decode), % of the relevant peak, and\n"
    "speed relative to the reference and to the fastest row of the same shape. The FLOP rule is printed\n"
    "under the table. The reference is scalar code, measured once per shape. The rows of a shape are\n"
    "timed side by side: each is set up and run once (untimed), then they take one timed run each in\n"
    "turn, round after round, so a busy moment of the machine falls on all of them alike (JSON gives\n"
    "each row's timed_from_s and timed_to_s, seconds since the bench started).\n";

// `all` stands for every name of `all`; `extra` names are accepted too but
// only when given explicitly (auto measures a route some other row already
// measures, so "all" leaves it out).
std::vector<std::string> expand(const std::vector<std::string>& given, const std::vector<std::string>& all,
                                const std::string& flag, const std::string& valid,
                                const std::vector<std::string>& extra = {}) {
  std::vector<std::string> out;
  for (const auto& g : given) {
    if (g == "all") {
      for (const auto& a : all)
        if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
      continue;
    }
    if (std::find(all.begin(), all.end(), g) == all.end() && std::find(extra.begin(), extra.end(), g) == extra.end())
      throw InputError(flag + ": unknown value '" + g + "' (valid: " + valid + ")");
    if (std::find(out.begin(), out.end(), g) == out.end()) out.push_back(g);
  }
  return out;
}

// Fails before a long run when an output could not be written at the end.
void check_writable(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p(path);
  fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(flag + " " + path + ": directory " + dir.string() + " does not exist");
  if (fs::is_directory(p, ec)) throw InputError(flag + " " + path + ": is a directory");
  if (access(dir.c_str(), W_OK) != 0) throw InputError(flag + " " + path + ": directory is not writable");
}

}  // namespace

int cmd_bench(int argc, char** argv, int first) {
  Args a("bench", bench_options(), argc, argv, first);
  if (a.help()) {
    std::cout << kHelpHead << budget_text() << a.usage();
    return 0;
  }
  bench::Options o;
  o.models = a.list("model", "1b,4b");
  for (const auto& m : o.models) builtin_model(m);

  // ISAs: "all", a list, or $G3ATTN_ISA when the flag is absent.
  std::string isa_flag = a.str("isa"), isa_from = "--isa";
  if (isa_flag.empty()) {
    const char* env = std::getenv("G3ATTN_ISA");
    isa_flag = env && *env ? env : "all";
    if (env && *env) isa_from = "G3ATTN_ISA";
  }
  {
    std::vector<std::string> names = isa_names();
    std::string valid;
    for (const auto& n : names) valid += n + ", ";
    valid += "best, all";
    std::vector<std::string> given = split_list(isa_flag, isa_from);
    for (auto& g : given) {
      if (g == "best") g = best_isa();
      if (g != "all" && isa_target_bit(g) == 0)
        throw InputError(isa_from + ": unknown ISA '" + g + "' (valid: " + valid + ")");
    }
    o.isas = expand(given, names, "--isa", valid);
  }
  {
    std::vector<std::string> names;
    std::string valid;
    for (const Backend& b : backends()) {
      names.push_back(b.name);
      valid += b.name + std::string(", ");
    }
    o.backends = expand(a.list("backend", "all"), names, "--backend", valid + "auto, all", {"auto"});
  }
  o.phases = expand(a.list("phase", "prefill,decode"), bench::phase_names(), "--phase",
                    "prefill, decode, block, projections, all");
  o.new_tokens = a.integer("new-tokens", bench::kDefaultNewTokens, 1, 1 << 20);
  if (a.has("context"))
    for (const auto& c : a.list("context", "")) {
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(c, &used, 10);
      } catch (...) {
        used = 0;
      }
      if (used == 0 || used != c.size() || v < 1 || v > (1 << 24))
        throw InputError("--context: '" + c + "' is not a token count in [1, 16777216]");
      o.contexts.push_back(v);
    }
  o.batch = int(a.integer("batch", 1, 1, 1024));
  o.threads = int(a.integer("threads", 0, 1, 1024));
  o.repeat = int(a.integer("repeat", 0, 1, 1000000));
  // Element types and compute modes: one, a comma list (rows per entry, in
  // the order given, each once) or all.
  auto dtypes = [&](const std::string& flag) {
    std::vector<DType> v;
    for (const std::string& t : a.list(flag, "f32")) {
      const std::vector<DType> add =
          t == "all" ? std::vector<DType>{DType::F32, DType::BF16} : std::vector<DType>{parse_dtype(t, "--" + flag)};
      for (DType d : add)
        if (std::find(v.begin(), v.end(), d) == v.end()) v.push_back(d);
    }
    return v;
  };
  o.kv_dtypes = dtypes("kv-dtype");
  o.weight_dtype = parse_dtype(a.str("weight-dtype", "bf16"), "--weight-dtype");
  if (a.has("proj"))
    o.projs = expand(a.list("proj", ""), {"highway", "onednn"}, "--proj", "highway, onednn, auto, all", {"auto"});
  o.computes = dtypes("compute");
  double threshold = 10;
  if (a.has("threshold")) {
    const std::string t = a.str("threshold");
    size_t used = 0;
    try {
      threshold = std::stod(t, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != t.size() || !std::isfinite(threshold) || threshold < 0 || threshold > 10000)
      throw InputError("--threshold: '" + t + "' is not a percentage in [0, 10000]");
  }
  if (a.has("threshold") && !a.has("compare")) throw InputError("--threshold needs --compare OLD.json");
  const bool json_stdout = a.has("json") && a.str("json").empty();
  if (a.has("json") && !json_stdout) check_writable("--json", a.str("json"));
  if (a.has("csv")) check_writable("--csv", a.str("csv"));
  if (a.has("svg")) check_writable("--svg", a.str("svg"));
  std::vector<bench::Row> old_rows;
  if (a.has("compare")) old_rows = bench::load_rows(a.str("compare"));
  o.progress = isatty(STDERR_FILENO) != 0;
  bench::validate(o);

  bench::Result r = bench::run_bench(o);
  std::optional<bench::Comparison> cmp;
  if (a.has("compare")) cmp = bench::compare(old_rows, r.rows, threshold, a.str("compare"));

  if (a.has("json")) emit_json(a, bench::to_json(r, cmp ? &*cmp : nullptr).dump(1));
  if (a.has("csv")) {
    std::string s = bench::csv_text(r);
    write_file_atomic(a.str("csv"), std::vector<uint8_t>(s.begin(), s.end()));
  }
  if (a.has("svg")) {
    std::string s = bench::svg_text(r);
    write_file_atomic(a.str("svg"), std::vector<uint8_t>(s.begin(), s.end()));
  }
  if (!json_stdout) {
    std::cout << bench::table_text(r);
    if (cmp) std::cout << bench::compare_text(*cmp);
    std::cout.flush();
  }
  return 0;
}

}  // namespace g3::cli
