// g3attn run: the whole attention stack of a model (random weights from a
// seed, or a checkpoint) with chunked prefill and decode, then the routing
// summary, throughput, the local/global time split and KV memory.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <vector>
#include <nlohmann/json.hpp>

#include "generator/errors.h"
#include "runtime/bench/peaks.h"
#include "runtime/cli/api_run.h"
#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/run_report.h"
#include "runtime/exec/run.h"
#include "runtime/exec/run_driver.h"
#include "runtime/exec/thread_pool.h"
#include "runtime/io/checkpoint.h"
#include "runtime/cli/run_tp.h"
#include "runtime/tp/mpi_comm.h"

namespace g3::cli {

static std::vector<Option> run_options() {
  std::vector<Option> o = {
      {"model", Arity::Value, "NAME", "built-in size 270m|1b|4b|12b|27b (default 1b unless --config/--weights)"},
      {"config", Arity::Value, "FILE", "an HF config.json instead of --model"},
      {"weights", Arity::Value, "FILE|DIR",
       "checkpoint: model.safetensors, model.safetensors.index.json, or a directory with config.json "
       "(default: random weights from --seed)"},
      {"prompt", Arity::Value, "N", "prompt tokens per row, prefilled in chunks (default 2048)"},
      {"decode", Arity::Value, "N", "decode steps after the prompt, one token per row each (default 32)"},
      {"chunk", Arity::Value, "C", "prefill chunk in tokens per row (default 512)"},
      {"batch", Arity::Value, "B", "rows (sequences) run together (default 1)"},
      {"threads", Arity::Value, "N", "worker threads (default: every core, here " +
                                          std::to_string(ThreadPool::default_threads()) + ")"},
      {"seed", Arity::Value, "S", "seed of the random weights and inputs (default 0)"},
      {"weight-dtype", Arity::Value, "T", "random weights' type f32|bf16 (default bf16)"},
      {"verify", Arity::Switch, "", "also run the scalar reference (official full-length cache, double) and report max |diff|"},
      {"json", Arity::OptionalValue, "FILE",
       "the summary as JSON: alone, JSON instead of the text on stdout; with FILE, the text plus FILE"},
  };
  // Tensor parallelism (runtime/tp/); a build without MPI says so here.
  o.push_back({"tp", Arity::Value, "R",
               mpi_built() ? "tensor parallel over R MPI ranks, each holding Nkv/R KV heads of every layer: "
                             "mpirun -np R g3attn run --tp R ... (README \"Tensor parallelism (MPI)\")"
                           : "tensor parallel over MPI ranks: not available, this g3attn was built without MPI "
                             "(G3ATTN_WITH_MPI=OFF)"});
  for (auto& c : common_kernel_options()) o.push_back(c);
  o.push_back({"proj", Arity::Value, "NAME",
               "projection provider highway|onednn|auto (default auto: `g3attn plan` shows its choice per phase)"});
  return o;
}

// The DRAM read rate around the decode steps, for the decode floor: one
// pass of a bench::DramProbe before the first step, after the last, and
// after any step that ends kProbeEveryMs of decode since the last pass (a
// pass takes 15-35 ms at 30-70 GB/s, and is not part of the decode's time).
// Each stretch of steps between two passes is set against the mean of
// their rates, so a run whose machine changed pace midway is measured
// against the pace it met. A single rate taken after the run missed that:
// on an AMD EPYC Zen 4 VM, whose rate doubles or halves from one second to
// the next, 4B over 8192 positions measured 66.6 GB/s after a decode that
// had run at the slower rate, and reported 1.86x its floor.
class DramAroundDecode {
 public:
  static constexpr double kProbeEveryMs = 250;

  // The arrays are allocated and first touched here, before the run: made
  // at the first pass, that work slowed the decode step after it (270m, 2
  // steps: 6.7-14.3 ms/token against 2.2-2.8 without the passes; AMD EPYC
  // Zen 4). The passes themselves did not (4B, 64 steps, 9-10 passes:
  // 28.8-36.9 ms/token against 29.7-44.1, alternating with the old binary).
  DramAroundDecode(int threads, int64_t steps) : steps_(steps) {
    if (steps > 0) probe_ = std::make_unique<bench::DramProbe>(threads);
  }

  // RunRequest::decode_pause.
  void pause(int64_t done) {
    const double now = run_clock_ms();
    if (done > 0) since_ms_ += now - last_ms_;
    if (done == 0 || done == steps_ || since_ms_ >= kProbeEveryMs) {
      passes_.push_back({done, probe_->pass_gbs()});
      since_ms_ = 0;
    }
    last_ms_ = run_clock_ms();
  }

  // The floor's time for all steps at `bytes` a step, in ms (0 without two passes).
  double floor_ms(double bytes) const {
    double ms = 0;
    for (size_t i = 1; i < passes_.size(); ++i) {
      const double gbs = (passes_[i - 1].gbs + passes_[i].gbs) / 2;
      ms += double(passes_[i].done - passes_[i - 1].done) * bytes / (gbs * 1e9) * 1e3;
    }
    return ms;
  }

  struct Pass {
    int64_t done = 0;  // decode steps before it
    double gbs = 0;
  };
  const std::vector<Pass>& passes() const { return passes_; }

 private:
  int64_t steps_;
  std::unique_ptr<bench::DramProbe> probe_;
  std::vector<Pass> passes_;
  double since_ms_ = 0, last_ms_ = 0;
};

static nlohmann::json passes_json(const std::vector<DramAroundDecode::Pass>& passes) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& p : passes) j.push_back({{"after_steps", p.done}, {"gbs", p.gbs}});
  return j;
}

static std::string gib(uint64_t bytes) {
  char buf[64];
  if (bytes >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ull << 30));
  else std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1ull << 20));
  return buf;
}

int cmd_run(int argc, char** argv, int first) {
  Args a("run", run_options(), argc, argv, first);
  if (a.help()) {
    std::cout << "Usage: g3attn run [--model 1b] [--config C --weights FILE|DIR] [--prompt 2048] [--decode 32]\n"
                 "                  [--chunk 512] [--batch 1] [--threads N] [--backend B] [--isa I]\n"
                 "                  [--kv-dtype f32|bf16] [--compute f32|bf16] [--proj highway|onednn|auto]\n"
                 "                  [--seed S] [--verify] [--json [FILE]]\n"
                 "Runs the attention stack only (pre-norm, attention, post-norm, residual of every layer;\n"
                 "the MLPs, embeddings and logits are not part of it) on N(0,1) inputs: the prompt in\n"
                 "chunks, then decode steps, the hidden state flowing from layer to layer. Each layer is\n"
                 "routed to its kernel by the 5:1 local/global pattern; layers with equal keys share one.\n"
                 "Local layers keep a ring of W + chunk - 1 KV slots, global layers the full length.\n"
                 "Around the decode steps it reads 1 GiB (at least 4x the last-level cache; allocated\n"
                 "for the whole run) to measure the DRAM read rate: before the first step, after the last\n"
                 "and after every 250 ms of decode, outside the decode's timing. It prints the decode\n"
                 "floor: the bytes one step must read (every layer's projection weights, each sequence's\n"
                 "visible K/V rows at the mean decode context) at those rates, each stretch of steps at\n"
                 "the mean of the two passes around it, and the run's ms/token step as a multiple of it\n"
                 "(\"decode_floor\" in --json, with each pass in \"dram_passes\"); and\n"
                 "each layer kind's mean decode ms per layer and step, the figure `g3attn bench\n"
                 "--phase block --new-tokens 1` times for one layer (\"decode_ms_per_layer\").\n"
                 "With no arguments: --model 1b --prompt 2048 --decode 32 --chunk 512.\n\n"
              << a.usage();
    return 0;
  }
  RunRequest r;
  if (a.has("weights") && !a.has("model") && !a.has("config")) {
    r.config = open_checkpoint(a.str("weights"), nullptr).config;
  } else {
    r.config = model_from_args(a, "1b");
  }
  r.weights = a.str("weights");
  r.prompt = a.integer("prompt", 2048, 1, 1 << 24);
  r.decode = a.integer("decode", 32, 0, 1 << 24);
  r.chunk = a.integer("chunk", 512, 1, 1 << 24);
  r.batch = a.integer("batch", 1, 1, 4096);
  r.threads = int(a.integer("threads", 0, 1, 1024));
  r.seed = uint64_t(a.integer("seed", 0, 0, (1ll << 62)));
  r.weight_dtype = parse_dtype(a.str("weight-dtype", "bf16"), "--weight-dtype");
  r.backend = a.str("backend", "auto");
  r.isa = a.str("isa");
  r.kv_dtype = parse_dtype(a.str("kv-dtype", "f32"), "--kv-dtype");
  r.compute = parse_dtype(a.str("compute", "f32"), "--compute");
  r.proj = parse_projection_route(a.str("proj", "auto"));
  r.verify = a.has("verify");

  const bool tty = isatty(STDERR_FILENO);
  std::string last_phase;
  int last_pct = -1;
  r.progress = [&](const std::string& phase, int64_t done, int64_t total) {
    const int pct = total > 0 ? int(100 * done / total) : 100;
    if (tty) {
      const int width = 30, fill = total > 0 ? int(width * done / total) : width;
      std::fprintf(stderr, "\r%-15s [%s%s] %3d%%", phase.c_str(), std::string(size_t(fill), '#').c_str(),
                   std::string(size_t(width - fill), ' ').c_str(), pct);
      if (done >= total) std::fprintf(stderr, "\n");
      std::fflush(stderr);
    } else if (phase != last_phase || pct / 25 != last_pct / 25) {
      // Plain lines for logs: one per quarter of each phase.
      std::fprintf(stderr, "%s: %d%%\n", phase.c_str(), pct);
    }
    last_phase = phase;
    last_pct = pct;
  };

  if (a.has("tp")) return run_tp(a, r, argc, argv, first);
  // Validate everything, the --json path included, before printing or
  // computing: a rejection is one line on stderr.
  check_run_request(r);
  if (a.has("json") && !a.str("json").empty()) check_output_path(a.str("json"), "--json");
  std::cerr << "g3attn run: model " << r.config.name << ", attention stack only (the MLPs are not part of it), "
            << r.batch << " x (" << r.prompt << " prompt + " << r.decode << " decode) tokens\n";
  const ApiHandle<g3attn_model> model = api_model(a);
  DramAroundDecode dram(r.threads > 0 ? r.threads : ThreadPool::default_threads(), r.decode);
  r.decode_pause = [&dram](int64_t done) { dram.pause(done); };
  RunResult res = run_through_api(r, model.get());
  // The decode floor: the bytes a step must read (decode_traffic.h) at the
  // DRAM read rate measured around the steps, on the run's threads. Weights
  // that fit in the last-level cache can beat it.
  struct Floor {
    double dram_gbs = 0, min_gbs = 0, max_gbs = 0, ms = 0, ratio = 0;
  } floor;
  if (const double total_ms = dram.floor_ms(res.decode_traffic.total()); total_ms > 0) {
    floor.ms = total_ms / double(r.decode);
    floor.dram_gbs = res.decode_traffic.total() / (floor.ms * 1e-3) / 1e9;
    floor.ratio = res.decode_ms_per_token / floor.ms;
    floor.min_gbs = floor.max_gbs = dram.passes().front().gbs;
    for (const auto& p : dram.passes()) {
      floor.min_gbs = std::min(floor.min_gbs, p.gbs);
      floor.max_gbs = std::max(floor.max_gbs, p.gbs);
    }
  }

  // The text summary goes to stdout unless `--json` alone asked for JSON
  // there instead (README: then stdout holds only the JSON document).
  const bool json_stdout = a.has("json") && a.str("json").empty();
  if (!json_stdout) {
    print_model_line(res);
    std::printf("batch %lld, prompt %lld, decode %lld, chunk %lld, kv %s, compute %s, %d threads, isa %s\n",
                (long long)r.batch, (long long)r.prompt, (long long)r.decode, (long long)std::min(r.chunk, r.prompt),
                to_string(r.kv_dtype), to_string(r.compute), res.threads, res.isa.c_str());
    print_routing(res);
    print_rates(r, res, "time split");
    if (floor.ms > 0)
      std::printf("decode floor: %.1f MB/step (weights %.1f MB, K/V %.1f MB) at %.1f GB/s DRAM read "
                  "(%zu passes around the steps, %.1f-%.1f GB/s) = %.3f ms; this run %.2fx the floor\n",
                  res.decode_traffic.total() / 1e6, res.decode_traffic.weight_bytes / 1e6,
                  res.decode_traffic.kv_bytes / 1e6, floor.dram_gbs, dram.passes().size(), floor.min_gbs,
                  floor.max_gbs, floor.ms, floor.ratio);
    std::printf("KV memory: %s ring vs %s full length (%lld positions)\n", gib(res.kv.ring).c_str(),
                gib(res.kv.full_length).c_str(), (long long)(r.prompt + r.decode));
    if (res.verified) std::printf("%s\n", verify_text(res).c_str());
    std::fflush(stdout);
  }

  if (a.has("json")) {
    nlohmann::json j = run_json(r, res);
    if (floor.ms > 0)
      j["decode_floor"] = {{"weight_bytes", res.decode_traffic.weight_bytes},
                           {"kv_bytes", res.decode_traffic.kv_bytes},
                           {"dram_read_gbs", floor.dram_gbs},
                           {"dram_passes", passes_json(dram.passes())},
                           {"floor_ms", floor.ms},
                           {"ratio", floor.ratio}};
    emit_json(a, j.dump(1));
  }
  return 0;
}

}  // namespace g3::cli
