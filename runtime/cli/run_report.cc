#include "runtime/cli/run_report.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

#include "runtime/report/text_table.h"

namespace g3::cli {

void print_model_line(const RunResult& res) {
  const int nglobal = int(std::count_if(res.layers.begin(), res.layers.end(),
                                        [](const RunLayer& l) { return l.kind == LayerKind::Global; }));
  std::printf("model %s: hidden_size %d, %d layers (%d local, %d global); attention stack only, MLPs not included\n",
              res.config.name.c_str(), res.config.hidden_size, res.config.num_layers,
              res.config.num_layers - nglobal, nglobal);
}

void print_routing(const RunResult& res) {
  std::map<std::string, std::vector<const RunLayer*>> routes;
  for (const auto& l : res.layers) routes[l.key].push_back(&l);
  std::vector<std::vector<std::string>> table = {{"key", "kind", "layers", "backend", "isa"}};
  for (const auto& [k, ls] : routes)
    table.push_back({k, to_string(ls[0]->kind), std::to_string(ls.size()),
                     ls[0]->backend + (ls[0]->specialised ? "" : " (generic)"), ls[0]->isa});
  std::fflush(stdout);  // printf and std::cout share stdout: keep the order
  std::cout << format_table(table) << std::flush;
}

namespace {

// Mean decode time of one layer of `kind` in one step, in ms (nullopt when
// the model has no layer of that kind or the run took no decode step): the
// figure to set beside the bench's 1-token block row of that kind, which
// times one layer's step the same way.
std::optional<double> decode_ms_per_layer(const RunRequest& r, const RunResult& res, LayerKind kind) {
  double ms = 0;
  int n = 0;
  for (const RunLayer& l : res.layers)
    if (l.kind == kind) ms += l.decode_ms, ++n;
  if (n == 0 || r.decode <= 0) return std::nullopt;
  return ms / n / double(r.decode);
}

}  // namespace

void print_rates(const RunRequest& r, const RunResult& res, const std::string& split_label) {
  std::printf("prefill: %.1f tokens/s (%.3f s)\n", res.prefill_tokens_per_s, res.prefill_s);
  if (r.decode > 0) {
    std::printf("decode:  %.3f ms/token step (%.3f s)\n", res.decode_ms_per_token, res.decode_s);
    std::printf("decode per layer and step:");
    const char* sep = " ";
    for (LayerKind kind : {LayerKind::Local, LayerKind::Global})
      if (const auto ms = decode_ms_per_layer(r, res, kind)) {
        std::printf("%s%s %.3f ms", sep, to_string(kind), *ms);
        sep = ", ";
      }
    std::printf(" (what bench's 1-token block rows time)\n");
  }
  const double tot = std::max(1e-9, res.local_ms + res.global_ms);
  std::printf("%s: local layers %.1f ms (%.0f%%), global layers %.1f ms (%.0f%%)\n", split_label.c_str(),
              res.local_ms, 100 * res.local_ms / tot, res.global_ms, 100 * res.global_ms / tot);
}

std::string verify_text(const RunResult& res) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "verify: max |diff| vs scalar reference %.3g (prefill %.3g, decode %.3g; reference took %.1f s)",
                res.max_abs_diff, res.max_abs_diff_prefill, res.max_abs_diff_decode, res.verify_s);
  return buf;
}

nlohmann::json run_json(const RunRequest& r, const RunResult& res) {
  nlohmann::json j;
  j["model"] = {{"name", res.config.name}, {"hidden_size", res.config.hidden_size},
                {"num_layers", res.config.num_layers}};
  j["attention_only"] = true;
  j["batch"] = r.batch;
  j["prompt"] = r.prompt;
  j["decode"] = r.decode;
  j["chunk"] = std::min(r.chunk, r.prompt);
  j["threads"] = res.threads;
  j["isa"] = res.isa;
  j["kv_dtype"] = to_string(r.kv_dtype);
  j["compute"] = to_string(r.compute);
  j["prefill_tokens_per_s"] = res.prefill_tokens_per_s;
  j["prefill_s"] = res.prefill_s;
  j["decode_ms_per_token"] = res.decode_ms_per_token;
  if (r.decode > 0) {
    nlohmann::json per;
    for (LayerKind kind : {LayerKind::Local, LayerKind::Global}) {
      const auto ms = decode_ms_per_layer(r, res, kind);
      per[to_string(kind)] = ms ? nlohmann::json(*ms) : nlohmann::json(nullptr);
    }
    j["decode_ms_per_layer"] = per;
  }
  j["local_ms"] = res.local_ms;
  j["global_ms"] = res.global_ms;
  j["kv_bytes"] = {{"ring", res.kv.ring}, {"full_length", res.kv.full_length}};
  if (res.verified)
    j["verify"] = {{"max_abs_diff", res.max_abs_diff},
                   {"max_abs_diff_prefill", res.max_abs_diff_prefill},
                   {"max_abs_diff_decode", res.max_abs_diff_decode},
                   {"seconds", res.verify_s}};
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : res.layers)
    layers.push_back({{"index", l.index},
                      {"kind", to_string(l.kind)},
                      {"key", l.key},
                      {"backend", l.backend},
                      {"isa", l.isa},
                      {"specialised", l.specialised},
                      {"ms", l.prefill_ms + l.decode_ms},
                      {"prefill_ms", l.prefill_ms},
                      {"decode_ms", l.decode_ms}});
  j["layers"] = layers;
  return j;
}

}  // namespace g3::cli
