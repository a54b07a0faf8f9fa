// g3attn run --tp R under mpirun: every rank runs its KV head range of the
// stack; rank 0 alone prints the summary (or JSON) with the per-rank KV
// memory, the all-reduce payload per token and the share of time in it.
// Errors every rank meets alike are printed once, by rank 0; a failure of
// one rank is printed by that rank.
#include "runtime/cli/run_tp.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <new>
#include <nlohmann/json.hpp>

#include "generator/errors.h"
#include "runtime/cli/api_run.h"
#include "runtime/cli/run_report.h"
#include "runtime/tp/mpi_comm.h"
#include "runtime/tp/tp_run.h"

namespace g3::cli {

namespace {

std::string bytes_str(double bytes) {
  char buf[64];
  if (bytes >= double(1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / double(1ull << 30));
  else if (bytes >= double(1ull << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / double(1ull << 20));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  return buf;
}

void print_summary(const RunRequest& r, const TpRunResult& t) {
  const RunResult& res = t.run;
  print_model_line(res);
  std::printf("tensor parallel: %d ranks, %d of %d KV heads (%d of %d query heads) per rank, %d threads per rank\n",
              t.ranks, res.config.num_kv_heads / t.ranks, res.config.num_kv_heads, res.config.num_heads / t.ranks,
              res.config.num_heads, res.threads);
  std::printf("batch %lld, prompt %lld, decode %lld, chunk %lld, kv %s, compute %s, isa %s\n", (long long)r.batch,
              (long long)r.prompt, (long long)r.decode, (long long)std::min(r.chunk, r.prompt),
              to_string(r.kv_dtype), to_string(r.compute), res.isa.c_str());
  // Routing of rank 0's layers (a range keeps its layer's kernel key).
  print_routing(res);
  print_rates(r, res, "time split (rank 0)");
  std::string per_rank;
  for (size_t i = 0; i < t.kv_bytes_per_rank.size(); ++i)
    per_rank += (i ? ", " : "") + std::string("rank ") + std::to_string(i) + " " + bytes_str(t.kv_bytes_per_rank[i]);
  std::printf("KV memory per rank (ring, %lld positions): %s; one process: %s\n", (long long)(r.prompt + r.decode),
              per_rank.c_str(), bytes_str(double(t.kv_single_process)).c_str());
  std::string shares;
  double worst = 0;
  for (size_t i = 0; i < t.comm_s_per_rank.size(); ++i) {
    const double share = 100 * t.comm_s_per_rank[i] / std::max(1e-9, t.run_s_per_rank[i]);
    worst = std::max(worst, share);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%srank %zu %.1f%%", i ? ", " : "", i, share);
    shares += buf;
  }
  std::printf("all-reduce: %llu bytes per token per rank (%d layers x %d floats); share of prefill+decode time in "
              "it: %s (waiting for the slowest rank included)\n",
              (unsigned long long)t.allreduce_bytes_per_token, res.config.num_layers, res.config.hidden_size,
              shares.c_str());
  if (r.decode > 0) {
    std::string steps;
    for (size_t i = 0; i < t.comm_decode_s_per_rank.size(); ++i) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%srank %zu %.3f ms", i ? ", " : "", i,
                    1000 * t.comm_decode_s_per_rank[i] / double(r.decode));
      steps += buf;
    }
    std::printf("all-reduce time per decode step (%d calls of %lld bytes): %s; one such call alone: %.1f us\n",
                res.config.num_layers, (long long)(r.batch * res.config.hidden_size * 4), steps.c_str(),
                t.allreduce_call_us);
  }
  if (res.verified)
    std::printf("%s; vs the single-process run %.3g\n", verify_text(res).c_str(), t.max_abs_diff_single);
  std::fflush(stdout);
}

nlohmann::json to_json(const RunRequest& r, const TpRunResult& t) {
  nlohmann::json j = run_json(r, t.run);
  std::vector<uint64_t> kv_per_rank;
  for (double b : t.kv_bytes_per_rank) kv_per_rank.push_back(uint64_t(b));
  j["tp"] = {{"ranks", t.ranks},
             {"kv_bytes_per_rank", kv_per_rank},
             {"kv_bytes_single_process", t.kv_single_process},
             {"allreduce_bytes_per_token", t.allreduce_bytes_per_token},
             {"comm_s_per_rank", t.comm_s_per_rank},
             {"run_s_per_rank", t.run_s_per_rank},
             {"comm_decode_s_per_rank", t.comm_decode_s_per_rank},
             {"allreduce_call_us", t.allreduce_call_us}};
  if (t.run.verified) j["verify"]["max_abs_diff_single_process"] = t.max_abs_diff_single;
  return j;
}

}  // namespace

int run_tp(const Args& a, RunRequest r, int argc, char** argv, int first) {
  const int tp = int(a.integer("tp", 1, 1, 1 << 16));
  std::unique_ptr<Comm> comm = mpi_world();
  const int rank = comm->rank();
  const bool root = rank == 0;
  auto say = [&](const std::string& msg) { std::cerr << "g3attn run: " << msg << "\n"; };
  if (!root) r.progress = nullptr;

  // Checks every rank makes alike, so they all stop here together and the
  // message is printed once. Ranks started with different arguments would
  // disagree on the collective calls ahead and hang, so that comes first.
  std::string joined;
  for (int i = first; i < argc; ++i) joined += std::string(argv[i]) + '\0';
  try {
    if (!comm->all_same(std::hash<std::string>{}(joined)))
      throw InputError("the ranks were started with different arguments; every rank of `mpirun -np R g3attn run "
                       "--tp R ...` must get the same ones");
    check_run_request(r);
    check_tp_request(r, tp, *comm);
    if (a.has("json") && !a.str("json").empty()) check_output_path(a.str("json"), "--json");
  } catch (const InputError& e) {
    if (root) say(e.what());
    return 2;
  }
  if (root)
    std::cerr << "g3attn run: model " << r.config.name << " on " << tp
              << " ranks (tensor parallel), attention stack only (the MLPs are not part of it), " << r.batch
              << " x (" << r.prompt << " prompt + " << r.decode << " decode) tokens\n";

  TpRunResult res;
  try {
    // The API's model of the arguments, for the sharded layers and for the
    // single-process run verify compares with (through the C API as `g3attn
    // run` without --tp runs it).
    const ApiHandle<g3attn_model> model = api_model(a);
    res = run_tensor_parallel(r, model.get(), tp, *comm, [&model](const RunRequest& single) {
      return run_through_api(single, model.get());
    });
  } catch (const RankError& e) {
    say(e.what());
    return 2;
  } catch (const PeerFailed& e) {
    if (root) say(e.what());
    return 2;
  } catch (const InputError& e) {
    if (root) say(e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    // Other ranks may be inside an all-reduce: only ending the job frees them.
    say("rank " + std::to_string(rank) + ": out of memory");
    comm->abort(2);
  } catch (const std::exception& e) {
    say("rank " + std::to_string(rank) + ": internal error: " + e.what());
    comm->abort(1);
  }
  if (!root) return 0;
  const bool json_stdout = a.has("json") && a.str("json").empty();
  if (!json_stdout) print_summary(r, res);
  if (a.has("json")) emit_json(a, to_json(r, res).dump(1));
  return 0;
}

}  // namespace g3::cli
