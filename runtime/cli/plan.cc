// g3attn plan: per-layer routing of a model (kind, window, RoPE, alpha,
// kernel key, backend, ISA), as a table or JSON.
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "generator/errors.h"
#include "generator/kernel_key.h"
#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/dispatch/backends.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/kernel_registry.h"
#include "runtime/dispatch/onednn_route.h"
#include "runtime/dispatch/prefetch_route.h"
#include "runtime/exec/kv_cache.h"
#include "runtime/tp/shard_plan.h"

namespace g3::cli {

static std::vector<Option> plan_options() {
  std::vector<Option> o = {
      {"model", Arity::Value, "NAME", "built-in size: 270m|1b|4b|12b|27b"},
      {"config", Arity::Value, "FILE", "an HF config.json instead of --model"},
      {"json", Arity::OptionalValue, "FILE", "JSON instead of the table: to stdout, or to FILE"},
      {"weight-dtype", Arity::Value, "T", "projection weight type in the kernel key f32|bf16 (default bf16)"},
      {"context", Arity::Value, "N", "positions per sequence for the KV memory figures (default: the model's max_position_embeddings)"},
      {"batch", Arity::Value, "B", "sequences for the KV memory figures (default 1)"},
      {"chunk", Arity::Value, "C", "prefill chunk: local-layer rings get W + C - 1 slots (default: none, W slots)"},
  };
  o.push_back({"tp", Arity::Value, "R[,R...]",
               "tensor-parallel degrees: weight and KV bytes per rank for each R (R must divide Nkv)"});
  for (auto& c : common_kernel_options()) o.push_back(c);
  o.push_back({"proj", Arity::Value, "NAME",
               "projection provider highway|onednn|auto (default auto: the rule below, or a tune profile's choice)"});
  return o;
}

int cmd_plan(int argc, char** argv, int first) {
  Args a("plan", plan_options(), argc, argv, first);
  if (a.help()) {
    std::cout << "Usage: g3attn plan --model NAME | --config FILE [--context N] [--batch B] [--chunk C] [--json [FILE]]\n"
                 "Prints one row per layer: index, kind, window, rope base and scale, alpha,\n"
                 "heads, KV heads, head_dim, kernel key, backend of the attention core, ISA,\n"
                 "then the KV cache memory at --context positions x --batch sequences: \"ring\" is what\n"
                 "`g3attn run` allocates (global layers full length, local layers a ring of W slots,\n"
                 "W + C - 1 with --chunk C), \"full_length\" the official layout (every layer N slots).\n"
                 "Then the projection provider (Highway's GEMM or oneDNN's matmul) of prefill-sized calls\n"
                 "(more than " << kProjDecodeMaxRows << " rows) and decode-sized ones, and where each choice came from. --proj:\n"
                 "  " << projection_rule_text() << ".\n\n"
              << a.usage();
    return 0;
  }
  ModelConfig m = model_from_args(a);
  std::string backend = parse_backend(a.str("backend", "auto"));
  std::string isa = isa_from_flag(a.str("isa"));
  DType kv = parse_dtype(a.str("kv-dtype", "f32"), "--kv-dtype");
  DType wt = parse_dtype(a.str("weight-dtype", "bf16"), "--weight-dtype");
  const DType compute = parse_dtype(a.str("compute", "f32"), "--compute");
  // bf16 compute runs on bf16 weights whatever the checkpoint holds.
  if (compute == DType::BF16) wt = DType::BF16;
  const int64_t context = a.integer("context", m.max_position_embeddings, 1, 1ll << 31);
  const int64_t batch = a.integer("batch", 1, 1, 1 << 20);
  const int64_t chunk = a.integer("chunk", 1, 1, 1ll << 31);
  const KvBytes kvb = kv_bytes(m, context, batch, kv, chunk);
  const ProjectionRoute proj = parse_projection_route(a.str("proj", "auto"));
  // --tp: every degree is checked before anything is printed.
  std::vector<ShardBytes> shards;
  if (a.has("tp"))
    for (const std::string& item : a.list("tp", "")) {
      size_t used = 0;
      int R = 0;
      try {
        R = std::stoi(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != item.size() || R < 1) throw InputError("--tp: '" + item + "' is not a positive integer");
      shards.push_back(shard_bytes(m, R, wt, context, batch, kv, chunk));
    }

  // One choice per distinct key and phase: auto may route a layer's prefill
  // and decode calls to different backends (a tune profile, profile.h).
  std::map<std::string, KernelChoice> choices, decode_choices;
  // The distinct projection choices of the layers (one, unless the layers'
  // GEMM backends differ), for the lines under the table.
  std::map<std::pair<bool, bool>, std::pair<ProjectionChoice, ProjectionChoice>> proj_choices;
  nlohmann::json layers = nlohmann::json::array();
  std::vector<std::vector<std::string>> table = {{"layer", "kind", "window", "rope_base", "rope_scale", "alpha", "N",
                                                  "Nkv", "head_dim", "key", "backend", "decode", "isa"}};
  if (backend == "auto") table[0].push_back("auto's choice");
  for (const LayerSpec& l : layer_specs(m)) {
    KernelKey key = kernel_key(l, kv, wt, compute);
    auto it = choices.find(key.str());
    if (it == choices.end()) it = choices.emplace(key.str(), kernels_for(key, backend, isa, Phase::Prefill)).first;
    auto dit = decode_choices.find(key.str());
    if (dit == decode_choices.end())
      dit = decode_choices.emplace(key.str(), kernels_for(key, backend, isa, Phase::Decode)).first;
    const KernelChoice& c = it->second;
    const KernelChoice& dc = dit->second;
    // The projection provider per phase, as prepare_layer resolves it.
    const bool capped = isa != best_isa();
    const ProjectionChoice pp = explain_projection(proj, Phase::Prefill, compute, c.stages[Stage::Gemm], capped);
    const ProjectionChoice pd = explain_projection(proj, Phase::Decode, compute, dc.stages[Stage::Gemm], capped);
    proj_choices[{pp.provider == ProjProvider::Onednn, pd.provider == ProjProvider::Onednn}] = {pp, pd};
    nlohmann::json j;
    j["index"] = l.index;
    j["kind"] = to_string(l.kind);
    j["window"] = l.window > 0 ? nlohmann::json(l.window) : nlohmann::json(nullptr);
    j["rope_base"] = l.rope_base;
    j["rope_scale"] = l.rope_scale;
    j["alpha"] = l.alpha;
    j["num_heads"] = l.num_heads;
    j["num_kv_heads"] = l.num_kv_heads;
    j["head_dim"] = l.head_dim;
    j["key"] = key.str();
    j["compute"] = to_string(compute);
    j["backend"] = c.backend;
    j["decode_backend"] = dc.backend;
    if (!c.source.empty()) j["source"] = c.source;
    if (!dc.source.empty()) j["decode_source"] = dc.source;
    j["proj"] = {{"prefill", to_string(pp.provider)}, {"decode", to_string(pd.provider)}};
    j["isa"] = c.kernels.isa;
    j["specialised"] = c.kernels.specialised;
    for (Stage s : kStages) j["stages"][stage_name(s)] = c.stages[s];
    if (!c.fallback.empty()) j["fallback"] = c.fallback;
    if (find_backend(c.backend)->kind == BackendKind::Jit) {
      j["compile_ms"] = c.kernels.compile_ms;
      j["cached"] = c.kernels.cached;
    }
    // Auto's sources; where the profile's winner changes with the context,
    // the calls of each context range take its winner (block.h for_call).
    // The decode column names each range's backend then ("xbyak, highway
    // from 4700"), since the layer's own decode choice does not serve them.
    std::string why = c.source == dc.source ? c.source : "prefill " + c.source + "; decode " + dc.source;
    std::string decode_col = dc.backend;
    if (backend == "auto")
      for (Phase ph : {Phase::Prefill, Phase::Decode}) {
        const std::vector<ContextRoute> routes = context_routes(key, ph, isa);
        if (ph == Phase::Decode && !routes.empty()) decode_col.clear();
        for (const ContextRoute& r : routes) {
          why += std::string("; ") + to_string(ph) + " from context " + std::to_string(r.from) + ": " +
                 r.route.backend + " (" + r.route.source + ")";
          j["by_context"][to_string(ph)].push_back(
              {{"from", r.from}, {"backend", r.route.backend}, {"source", r.route.source}});
          if (ph == Phase::Decode)
            decode_col += decode_col.empty() ? r.route.backend
                                             : ", " + r.route.backend + " from " + std::to_string(r.from);
        }
      }
    layers.push_back(j);
    std::string be = c.backend + (c.kernels.specialised ? "" : " (generic)");
    table.push_back({std::to_string(l.index), to_string(l.kind), l.window > 0 ? std::to_string(l.window) : "-",
                     fmt_double(l.rope_base), fmt_double(l.rope_scale), fmt_double(l.alpha, 9),
                     std::to_string(l.num_heads), std::to_string(l.num_kv_heads), std::to_string(l.head_dim),
                     key.str(), be, decode_col, c.kernels.isa});
    if (backend == "auto") table.back().push_back(why);
  }
  // Without a profile auto runs the static rule; say once how to measure.
  const std::string hint = backend == "auto" && !active_profile()
                               ? "run `g3attn tune` to measure the backends on this CPU; until then auto follows "
                                 "the static rule"
                               : "";
  if (a.has("json")) {
    nlohmann::json out;
    out["model"] = {{"name", m.name}, {"hidden_size", m.hidden_size}, {"num_layers", m.num_layers}};
    out["layers"] = layers;
    for (const Backend& b : backends()) {
      // The reference builds nothing; the others count kernels made.
      if (b.kind != BackendKind::Reference) out["kernels_built"][b.name] = kernels_built(b.name);
      // Observable proof of a JIT's disk cache: a second process compiles nothing.
      if (b.compiles) out[b.name] = {{"compiles", b.compiles()}, {"cache_hits", b.cache_hits()}};
    }
    if (!m.defaulted.empty()) out["defaults_used"] = m.defaulted;
    out["kv_bytes"] = {{"ring", kvb.ring},        {"full_length", kvb.full_length},
                       {"context", context},      {"batch", batch},
                       {"dtype", to_string(kv)}};
    if (a.has("chunk")) out["kv_bytes"]["chunk"] = chunk;
    for (const ShardBytes& sb : shards)
      out["tp"].push_back({{"ranks", sb.ranks}, {"weight_bytes_per_rank", sb.weights},
                           {"kv_bytes_per_rank", {{"ring", sb.kv.ring}, {"full_length", sb.kv.full_length}}}});
    if (!hint.empty()) out["hint"] = hint;
    out["proj_request"] = to_string(proj);
    out["decode_prefetch"] = {{"setting", decode_prefetch().str()}, {"source", decode_prefetch_source()}};
    for (const auto& [k, v] : proj_choices)
      out["projections"].push_back({{"prefill", {{"provider", to_string(v.first.provider)}, {"source", v.first.source}}},
                                    {"decode", {{"provider", to_string(v.second.provider)}, {"source", v.second.source}}}});
    emit_json(a, out.dump(1));
    return 0;
  }
  std::cout << "model " << m.name << ": hidden_size " << m.hidden_size << ", " << m.num_layers << " layers, "
            << choices.size() << " distinct kernel keys\n";
  if (!m.defaulted.empty()) {
    std::cout << "HF defaults used for fields the config omits:";
    for (const auto& d : m.defaulted) std::cout << " " << d;
    std::cout << "\n";
  }
  std::cout << format_table(table);
  for (const auto& [k, c] : choices)
    if (!c.fallback.empty()) std::cout << "note: " << k << ": " << c.fallback << "\n";
  if (!hint.empty()) std::cout << "hint: " << hint << "\n";
  for (const auto& [k, v] : proj_choices)
    std::cout << "projections (--proj " << to_string(proj) << ", compute " << to_string(compute) << "): prefill "
              << to_string(v.first.provider) << " (" << v.first.source << "), decode " << to_string(v.second.provider)
              << " (" << v.second.source << ")\n";
  std::cout << "decode prefetch of the cores: " << decode_prefetch().str() << " (" << decode_prefetch_source()
            << ")\n";
  auto gib = [](uint64_t b) { return fmt_double(double(b) / double(1ull << 30), 4) + " GiB"; };
  std::cout << "KV cache (" << to_string(kv) << ", " << context << " positions x " << batch << " sequence"
            << (batch == 1 ? "" : "s") << (a.has("chunk") ? ", chunk " + std::to_string(chunk) : std::string())
            << "): ring " << gib(kvb.ring) << " (" << kvb.ring << " bytes) vs full length " << gib(kvb.full_length)
            << " (" << kvb.full_length << " bytes)\n";
  if (!shards.empty()) {
    std::vector<std::vector<std::string>> t = {{"tp ranks", "KV heads/rank", "weights/rank (" + std::string(to_string(wt)) +
                                                 ")", "KV ring/rank", "KV full length/rank"}};
    for (const ShardBytes& sb : shards)
      t.push_back({std::to_string(sb.ranks), std::to_string(m.num_kv_heads / sb.ranks), gib(sb.weights),
                   gib(sb.kv.ring), gib(sb.kv.full_length)});
    std::cout << "tensor parallel (attention weights and KV caches per rank):\n" << format_table(t);
  }
  return 0;
}

}  // namespace g3::cli
