#include "runtime/dispatch/profile.h"

#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "generator/errors.h"
#include "generator/llvm/jit_cache.h"
#include "generator/text_file.h"
#include "runtime/dispatch/backends.h"
#include "runtime/dispatch/onednn_route.h"
#include "runtime/dispatch/prefetch_route.h"
#include "runtime/io/npy.h"

namespace g3 {

const char* to_string(Phase p) { return p == Phase::Prefill ? "prefill" : "decode"; }

std::string g3attn_version() { return G3ATTN_VERSION; }

std::string CpuIdentity::id() const {
  return vendor + " family " + std::to_string(family) + " model " + std::to_string(model) + " stepping " +
         std::to_string(stepping) + " (" + model_name + "); " + features;
}

namespace {

// The features the backends' availability and speed depend on, as Linux
// names them in /proc/cpuinfo.
const char* const kFeatures[] = {"avx2",        "fma",          "avx512f",  "avx512bw", "avx512dq",
                                 "avx512vl",    "avx512_vnni",  "avx512_bf16", "avx512_vbmi2",
                                 "amx_tile",    "amx_bf16"};

CpuIdentity read_cpu() {
  CpuIdentity c;
  unsigned a = 0, b = 0, cx = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &cx, &d)) {
    char v[13] = {};
    std::memcpy(v, &b, 4);
    std::memcpy(v + 4, &d, 4);
    std::memcpy(v + 8, &cx, 4);
    c.vendor = v;
  }
  if (__get_cpuid(1, &a, &b, &cx, &d)) {
    const int base_family = int((a >> 8) & 0xf), base_model = int((a >> 4) & 0xf);
    c.family = base_family == 0xf ? base_family + int((a >> 20) & 0xff) : base_family;
    c.model = base_family == 0x6 || base_family == 0xf ? (int((a >> 16) & 0xf) << 4) + base_model : base_model;
    c.stepping = int(a & 0xf);
  }
  std::ifstream f("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(f, line)) {
    auto value = [&] { return line.substr(line.find(':') == std::string::npos ? line.size() : line.find(':') + 1); };
    if (c.model_name.empty() && line.rfind("model name", 0) == 0) c.model_name = value();
    if (flags.empty() && line.rfind("flags", 0) == 0) flags = value();
  }
  while (!c.model_name.empty() && c.model_name.front() == ' ') c.model_name.erase(0, 1);
  std::set<std::string> have;
  std::istringstream fs(flags);
  for (std::string w; fs >> w;) have.insert(w);
  for (const char* name : kFeatures)
    if (have.count(name)) {
      if (!c.features.empty()) c.features += ' ';
      c.features += name;
    }
  return c;
}

void warn(const std::string& s) { std::fprintf(stderr, "g3attn: warning: %s\n", s.c_str()); }

}  // namespace

const CpuIdentity& this_cpu() {
  static const CpuIdentity c = read_cpu();
  return c;
}

// The runner-up's relative time over the best one's, minus 1 (0 with one
// candidate): how much the best one wins by.
static double margin_of(const std::map<std::string, double>& rel, const std::string& best) {
  double second = 0;
  for (const auto& [name, r] : rel)
    if (name != best && (second == 0 || r < second)) second = r;
  const auto it = rel.find(best);
  return second > 0 && it != rel.end() && it->second > 0 ? second / it->second - 1 : 0;
}

double ProfileEntry::margin() const { return margin_of(rel, best); }

double ProjectionEntry::margin() const { return margin_of(rel, best); }

double PrefetchEntry::gain() const {
  const auto b = rel.find(best), d = rel.find(DecodePrefetch{}.str());
  return b != rel.end() && d != rel.end() && b->second > 0 && d->second > b->second ? d->second / b->second - 1 : 0;
}

const ProjectionEntry* Profile::find_projection(Phase phase, DType compute) const {
  for (const ProjectionEntry& e : projections)
    if (e.phase == phase && e.compute == compute) return &e;
  return nullptr;
}

const ProfileEntry* Profile::find(const std::string& key, Phase phase, const std::string& isa) const {
  for (const ProfileEntry& e : entries)
    if (e.key == key && e.phase == phase && e.isa == isa) return &e;
  return nullptr;
}

std::string profile_path() {
  const std::string dir = default_jit_cache_dir();
  if (dir.empty()) return "";
  char hex[17];
  const std::string id = this_cpu().id();
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fnv1a64(id.data(), id.size()));
  return dir + "/tune-" + hex + ".json";
}

void save_profile(const Profile& p, const std::string& path) {
  nlohmann::json j;
  j["format"] = p.format;
  j["g3attn_version"] = p.version;
  const CpuIdentity& c = this_cpu();
  j["cpu"] = {{"id", p.cpu},         {"vendor", c.vendor},     {"model_name", c.model_name},
              {"family", c.family},  {"model", c.model},       {"stepping", c.stepping},
              {"features", c.features}};
  j["threads"] = p.threads;
  j["entries"] = nlohmann::json::array();
  for (const ProfileEntry& e : p.entries) {
    nlohmann::json je = {{"key", e.key}, {"phase", to_string(e.phase)}, {"isa", e.isa}, {"best", e.best},
                         {"ms", e.ms}, {"rel", e.rel}};
    for (const auto& [ctx, ms] : e.ms_at) je["ms_at"][std::to_string(ctx)] = ms;
    je["tie"] = e.tie;
    j["entries"].push_back(je);
  }
  j["projections"] = nlohmann::json::array();
  for (const ProjectionEntry& e : p.projections)
    j["projections"].push_back({{"phase", to_string(e.phase)}, {"compute", to_string(e.compute)}, {"best", e.best},
                                {"ms", e.ms}, {"rel", e.rel}});
  if (p.prefetch) j["decode_prefetch"] = {{"best", p.prefetch->best}, {"ms", p.prefetch->ms}, {"rel", p.prefetch->rel}};
  const std::string text = j.dump(1) + "\n";
  write_file_atomic(path, std::vector<uint8_t>(text.begin(), text.end()));
}

Profile load_profile(const std::string& path) {
  // A profile of every built-in model is tens of kilobytes.
  const std::string text = read_text_file(path, size_t{64} << 20);
  Profile p;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    p.format = j.at("format").get<int>();
    if (p.format != Profile{}.format)
      throw InputError(path + ": profile format " + std::to_string(p.format) + " is not " +
                       std::to_string(Profile{}.format));
    p.version = j.at("g3attn_version").get<std::string>();
    p.cpu = j.at("cpu").at("id").get<std::string>();
    p.threads = j.at("threads").get<int>();
    for (const auto& e : j.at("entries")) {
      ProfileEntry pe;
      pe.key = e.at("key").get<std::string>();
      pe.isa = e.at("isa").get<std::string>();
      const std::string phase = e.at("phase").get<std::string>();
      if (phase != "prefill" && phase != "decode") throw InputError(path + ": unknown phase '" + phase + "'");
      pe.phase = phase == "prefill" ? Phase::Prefill : Phase::Decode;
      pe.best = e.at("best").get<std::string>();
      pe.ms = e.at("ms").get<std::map<std::string, double>>();
      pe.rel = e.at("rel").get<std::map<std::string, double>>();
      if (!pe.rel.count(pe.best)) throw InputError(path + ": entry " + pe.key + " has no score for its best backend");
      for (const auto* m : {&pe.ms, &pe.rel})
        for (const auto& [name, v] : *m)
          if (!std::isfinite(v) || v <= 0)
            throw InputError(path + ": entry " + pe.key + " has a time for " + name + " that is not a positive number");
      if (!find_backend(pe.best)) throw InputError(path + ": unknown backend '" + pe.best + "'");
      if (e.contains("ms_at"))
        for (const auto& [ctx, per] : e.at("ms_at").items()) {
          size_t used = 0;
          long long c = 0;
          try {
            c = std::stoll(ctx, &used);
          } catch (const std::exception&) {
          }
          if (used == 0 || used != ctx.size() || c < 1)
            throw InputError(path + ": entry " + pe.key + " has a context '" + ctx +
                             "' that is not a positive integer");
          auto& at = pe.ms_at[c];
          at = per.get<std::map<std::string, double>>();
          for (const auto& [name, ms] : at) {
            if (!find_backend(name)) throw InputError(path + ": unknown backend '" + name + "'");
            if (!std::isfinite(ms) || ms <= 0)
              throw InputError(path + ": entry " + pe.key + " has a time for " + name + " at context " + ctx +
                               " that is not a positive number");
          }
          if (!at.count(pe.best))
            throw InputError(path + ": entry " + pe.key + " has no time for its best backend at context " + ctx);
        }
      if (e.contains("tie")) {
        pe.tie = e.at("tie").get<double>();
        if (!std::isfinite(pe.tie) || pe.tie < 0 || pe.tie > 1)
          throw InputError(path + ": entry " + pe.key + " has a tie that is not a fraction between 0 and 1");
      }
      p.entries.push_back(pe);
    }
    if (j.contains("projections"))
      for (const auto& e : j.at("projections")) {
        ProjectionEntry pe;
        const std::string phase = e.at("phase").get<std::string>(), compute = e.at("compute").get<std::string>();
        if (phase != "prefill" && phase != "decode") throw InputError(path + ": unknown phase '" + phase + "'");
        if (compute != "f32" && compute != "bf16")
          throw InputError(path + ": unknown compute mode '" + compute + "'");
        pe.phase = phase == "prefill" ? Phase::Prefill : Phase::Decode;
        pe.compute = compute == "bf16" ? DType::BF16 : DType::F32;
        pe.best = e.at("best").get<std::string>();
        if (pe.best != "highway" && pe.best != "onednn")
          throw InputError(path + ": unknown projection provider '" + pe.best + "'");
        pe.ms = e.at("ms").get<std::map<std::string, double>>();
        pe.rel = e.at("rel").get<std::map<std::string, double>>();
        if (!pe.rel.count(pe.best)) throw InputError(path + ": a projection entry has no score for its best provider");
        p.projections.push_back(pe);
      }
    if (j.contains("decode_prefetch")) {
      const auto& e = j.at("decode_prefetch");
      PrefetchEntry pe;
      pe.best = e.at("best").get<std::string>();
      pe.ms = e.at("ms").get<std::map<std::string, double>>();
      pe.rel = e.at("rel").get<std::map<std::string, double>>();
      for (const auto* m : {&pe.ms, &pe.rel})
        for (const auto& [name, v] : *m) {
          parse_decode_prefetch(name, path + ": decode_prefetch");
          if (!std::isfinite(v) || v <= 0)
            throw InputError(path + ": decode_prefetch has a time for " + name + " that is not a positive number");
        }
      parse_decode_prefetch(pe.best, path + ": decode_prefetch");
      if (!pe.rel.count(pe.best)) throw InputError(path + ": decode_prefetch has no score for its best setting");
      p.prefetch = pe;
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not a tune profile (" + std::string(e.what()) + ")");
  }
  return p;
}

const Profile* active_profile() {
  static const Profile* p = [] () -> const Profile* {
    const std::string path = profile_path();
    if (path.empty() || !std::ifstream(path)) return nullptr;
    try {
      static Profile loaded = load_profile(path);
      if (loaded.cpu != this_cpu().id()) {
        warn("tune profile " + path + " was measured on another CPU (" + loaded.cpu + "); using the static rule");
        return nullptr;
      }
      if (loaded.version != g3attn_version()) {
        warn("tune profile " + path + " is from g3attn " + loaded.version + ", this is " + g3attn_version() +
             "; using the static rule (run g3attn tune again)");
        return nullptr;
      }
      // The measured projection providers replace the default rule for
      // --proj auto (onednn_route.h).
      for (const ProjectionEntry& e : loaded.projections) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "profile: %.2fx the other provider", 1 + e.margin());
        set_projection_provider(e.phase, e.compute, e.best == "onednn" ? ProjProvider::Onednn : ProjProvider::Highway,
                                buf);
      }
      // The measured decode prefetch replaces the cores' default (prefetch_route.h).
      if (loaded.prefetch) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "profile: %.2fx the default", 1 + loaded.prefetch->gain());
        set_decode_prefetch(parse_decode_prefetch(loaded.prefetch->best, path), buf);
      }
      return &loaded;
    } catch (const InputError& e) {
      warn(std::string(e.what()) + "; using the static rule (run g3attn tune again)");
      return nullptr;
    }
  }();
  return p;
}

namespace {

// A backend measured here that cannot serve the key now (e.g. a JIT left
// out of this build) keeps the static rule.
bool can_serve(const std::string& name, const KernelKey& key, const std::string& isa) {
  const Backend* b = find_backend(name);
  return b && b->in_build && b->why_unavailable(key, isa).empty();
}

}  // namespace

std::string profile_choice(const ProfileEntry& e, const std::string& rule) {
  if (rule == e.best || !e.rel.count(rule) || !e.rel.count(e.best)) return e.best;
  for (const auto& [ctx, per] : e.ms_at)
    if (!per.count(rule)) return e.best;
  return e.rel.at(rule) <= e.rel.at(e.best) * (1 + e.tie) ? rule : e.best;
}

AutoRoute auto_route(const KernelKey& key, Phase phase, const std::string& isa) {
  AutoRoute r;
  r.backend = auto_backend(key, phase, isa).name;
  r.source = "static rule";
  if (const Profile* p = active_profile()) {
    if (const ProfileEntry* e = p->find(key.str(), phase, isa); e && can_serve(e->best, key, isa)) {
      char buf[160];
      if (profile_choice(*e, r.backend) == e->best) {
        std::snprintf(buf, sizeof buf, "profile: %.2fx the next backend", 1 + e->margin());
        r.backend = e->best;
      } else {
        std::snprintf(buf, sizeof buf, "profile: %s %.2fx ahead, within tune's noise (%.0f%%): the static rule",
                      e->best.c_str(), e->rel.at(r.backend) / e->rel.at(e->best), e->tie * 100);
      }
      r.source = buf;
      r.from_profile = true;
    }
  }
  return r;
}

std::vector<ContextRoute> context_routes(const ProfileEntry& e,
                                         const std::function<bool(const std::string&)>& servable) {
  if (e.ms_at.size() < 2 || !servable(e.best)) return {};
  // Each context's winner: the entry's best unless a servable backend was
  // more than a near-tie faster there.
  std::vector<std::pair<int64_t, std::string>> winner;
  for (const auto& [ctx, per] : e.ms_at) {
    const double own = per.at(e.best);
    std::string w = e.best;
    double w_ms = own;
    for (const auto& [name, ms] : per)
      if (ms < w_ms && ms * (1 + e.tie) < own && servable(name)) w = name, w_ms = ms;
    winner.emplace_back(ctx, w);
  }
  std::vector<ContextRoute> out;
  for (size_t i = 0; i < winner.size(); ++i) {
    const auto& [ctx, name] = winner[i];
    if (!out.empty() && out.back().route.backend == name) continue;  // neighbours with one winner are one range
    ContextRoute c;
    if (i > 0) {
      // a served the previous context, b serves this one: g = ln(b / a)
      // goes from above zero (a faster) to below; the switch is where its
      // line in log context crosses zero (the midpoint in log scale when a
      // time is missing or the two do not cross).
      const int64_t c0 = winner[i - 1].first;
      const std::string& a = winner[i - 1].second;
      const auto& p0 = e.ms_at.at(c0);
      const auto& p1 = e.ms_at.at(ctx);
      double t = 0.5;
      if (p0.count(name) && p1.count(a)) {
        const double g0 = std::log(p0.at(name) / p0.at(a)), g1 = std::log(p1.at(name) / p1.at(a));
        if (g0 > g1) t = std::clamp(g0 / (g0 - g1), 0.0, 1.0);
      }
      const double at = std::exp(std::log(double(c0)) + t * (std::log(double(ctx)) - std::log(double(c0))));
      c.from = std::clamp(int64_t(std::ceil(at * (1 - 1e-12))), c0 + 1, ctx);  // not 33 for 32 + rounding
    }
    c.route.backend = name;
    char buf[96];
    const double own = e.ms_at.at(ctx).at(e.best), ms = e.ms_at.at(ctx).at(name);
    if (name == e.best)
      std::snprintf(buf, sizeof buf, "profile: best over all contexts");
    else
      std::snprintf(buf, sizeof buf, "profile: %.2fx %s at context %lld", own / ms, e.best.c_str(), (long long)ctx);
    c.route.source = buf;
    c.route.from_profile = true;
    out.push_back(c);
  }
  if (out.size() < 2) return {};
  return out;
}

std::vector<ContextRoute> context_routes(const KernelKey& key, Phase phase, const std::string& isa) {
  const Profile* p = active_profile();
  const ProfileEntry* e = p ? p->find(key.str(), phase, isa) : nullptr;
  if (!e) return {};
  ProfileEntry chosen = *e;
  chosen.best = profile_choice(*e, auto_backend(key, phase, isa).name);
  return context_routes(chosen, [&](const std::string& name) { return can_serve(name, key, isa); });
}

}  // namespace g3
