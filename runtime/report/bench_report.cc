#include "runtime/report/bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "generator/errors.h"
#include "generator/text_file.h"
#include "runtime/dispatch/isa.h"
#include "runtime/report/text_table.h"

namespace g3::bench {

namespace {

// Numbers for people: four significant digits, no exponent for the usual
// ranges of milliseconds and GFLOP/s.
std::string num(double v) {
  char buf[64];
  if (!std::isfinite(v)) return "-";
  double a = std::fabs(v);
  if (a >= 1000) std::snprintf(buf, sizeof buf, "%.0f", v);
  else if (a >= 100) std::snprintf(buf, sizeof buf, "%.1f", v);
  else if (a >= 10) std::snprintf(buf, sizeof buf, "%.2f", v);
  else if (a >= 0.01 || a == 0) std::snprintf(buf, sizeof buf, "%.3f", v);
  else std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}
std::string opt_num(const std::optional<double>& v) { return v ? num(*v) : "-"; }
std::string ctx(const std::optional<int64_t>& c) { return c ? std::to_string(*c) : "-"; }


std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) {
        std::string s = line.substr(p + 1);
        s.erase(0, s.find_first_not_of(" \t"));
        return s;
      }
    }
  return "unknown";
}

nlohmann::json opt_json(const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

nlohmann::json row_json(const Row& r) {
  nlohmann::json j;
  j["backend"] = r.backend;
  j["route"] = r.route;
  j["proj"] = r.proj.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.proj);
  j["proj_route"] = r.proj_route.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.proj_route);
  j["isa"] = r.isa;
  j["model"] = r.model;
  j["kind"] = r.kind;
  j["phase"] = r.phase;
  j["kv_dtype"] = r.kv_dtype;
  j["weight_dtype"] = r.weight_dtype;
  j["compute"] = r.compute;
  j["key"] = r.key;
  j["isa_cap"] = r.isa_cap;
  j["batch"] = r.batch;
  j["new_tokens"] = r.new_tokens;
  j["context"] = r.context ? nlohmann::json(*r.context) : nlohmann::json(nullptr);
  j["ms_median"] = r.ms_median;
  j["ms_min"] = r.ms_min;
  j["gflops"] = r.gflops;
  j["gbs"] = opt_json(r.gbs);
  j["pct_peak"] = r.pct_peak;
  j["vs_reference"] = opt_json(r.vs_reference);
  j["vs_best"] = opt_json(r.vs_best);
  j["runs"] = r.runs;
  j["timed_from_s"] = r.timed_from_s;
  j["timed_to_s"] = r.timed_to_s;
  j["flops"] = r.flops;
  if (r.phase == "decode") j["kv_bytes"] = r.kv_bytes;
  j["specialised"] = r.specialised;
  for (Stage s : kStages) j["stages"][stage_name(s)] = r.stages[s];
  if (!r.stage_ms.empty()) {
    j["stage_ms"] = nlohmann::json::object();
    for (const auto& [name, ms] : r.stage_ms) j["stage_ms"][name] = ms;
  }
  return j;
}

nlohmann::json id_json(const Row& r) {
  return {{"backend", r.backend}, {"route", r.route},
          {"proj", r.proj.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.proj)}, {"isa", r.isa},
          {"model", r.model}, {"kind", r.kind},
          {"phase", r.phase}, {"kv_dtype", r.kv_dtype}, {"weight_dtype", r.weight_dtype}, {"compute", r.compute}, {"batch", r.batch},
          {"new_tokens", r.new_tokens},
          {"context", r.context ? nlohmann::json(*r.context) : nlohmann::json(nullptr)}};
}

std::string row_label(const Row& r) {
  return r.label() + " " + r.isa + (r.proj.empty() ? "" : " proj " + r.proj_label()) + " " + r.model + " " + r.kind + " " + r.phase + " kv " + r.kv_dtype + " w " +
         r.weight_dtype + " compute " + r.compute + " batch " + std::to_string(r.batch) + " new " + std::to_string(r.new_tokens) + " ctx " +
         ctx(r.context);
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

}  // namespace

std::string flop_rule() {
  return "FLOPs count useful work: attention core = 4 x dh x N_heads x (visible query-key pairs), so a local "
         "layer's masked keys do not count; projections = 2 x D x (N + 2 Nkv) x dh per token for Q/K/V plus "
         "2 x N x dh x D per token for the output; block = core + projections (norms, QK-norm and RoPE not "
         "counted). %peak is of the fp32 FMA peak for compute rows (a bf16 dot-product or AMX path may pass 100%) and of "
         "the DRAM read peak for decode rows (GB/s = K/V bytes read / time). vs_ref = reference time / this "
         "time; vs_best = best time of the same shape / this time (1 = fastest).";
}

std::string table_text(const Result& r) {
  std::ostringstream o;
  const Peaks& p = r.peaks;
  o << "peaks (" << p.threads << " thread" << (p.threads == 1 ? "" : "s") << "): fp32 FMA " << num(p.fp32_gflops)
    << " GFLOP/s (" << p.fp32_isa << "), bf16 dot "
    << (p.bf16_gflops ? num(*p.bf16_gflops) + " GFLOP/s (vdpbf16ps)" : std::string("n/a (no AVX512_BF16)"))
    << ", bf16 AMX " << (p.amx_gflops ? num(*p.amx_gflops) + " GFLOP/s (tdpbf16ps)" : "n/a (" + p.amx_unavailable + ")")
    << ", DRAM read " << num(p.dram_read_gbs) << " GB/s\n\n";
  std::vector<std::vector<std::string>> t = {{"backend", "isa", "proj", "model", "kind", "phase", "kv", "w", "cmp",
                                              "new", "ctx", "ms_med", "ms_min", "GFLOP/s", "GB/s", "%peak",
                                              "vs_ref", "vs_best", "runs"}};
  std::vector<bool> right = {false, false, false, false, false, false, false, false, false, true,
                             true,  true,  true,  true,  true,  true,  true,  true,  true};
  for (const Row& x : r.rows)
    t.push_back({x.label(), x.isa, x.proj_label(), x.model, x.kind, x.phase, x.kv_dtype, x.weight_dtype, x.compute,
                 std::to_string(x.new_tokens),
                 ctx(x.context), num(x.ms_median), num(x.ms_min), num(x.gflops), opt_num(x.gbs), num(x.pct_peak),
                 opt_num(x.vs_reference), opt_num(x.vs_best), std::to_string(x.runs)});
  if (r.rows.empty()) o << "(no rows)\n";
  else o << format_table(t, right);
  // The rule, wrapped at 100 columns for a terminal.
  {
    std::istringstream words(flop_rule());
    std::string w, line;
    o << "\n";
    while (words >> w) {
      if (!line.empty() && line.size() + 1 + w.size() > 100) {
        o << line << "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + w;
    }
    o << line << "\n";
  }
  if (r.options.batch > 1) o << "Every row covers a batch of " << r.options.batch << " sequences.\n";
  if (!r.notes.empty()) {
    o << "\nnotes:\n";
    for (const auto& n : r.notes) o << "  - " << n << "\n";
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "\n%zu rows in %.1f s\n", r.rows.size(), r.seconds);
  o << buf;
  return o.str();
}

std::vector<Row> load_rows(const std::string& path) {
  // A default bench's JSON is about 300 KB; 256 MiB is any run's.
  std::string text;
  try {
    text = read_text_file(path, size_t{256} << 20);
  } catch (const InputError& e) {
    throw InputError(std::string("--compare ") + e.what());
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception&) {
    throw InputError("--compare " + path + ": not valid JSON (expected the output of g3attn bench --json)");
  }
  if (!j.is_object() || !j.contains("rows") || !j["rows"].is_array())
    throw InputError("--compare " + path + ": no \"rows\" array (expected the output of g3attn bench --json)");
  std::vector<Row> rows;
  size_t i = 0;
  for (const auto& x : j["rows"]) {
    try {
      Row r;
      r.backend = x.at("backend").get<std::string>();
      // Files written before auto rows existed have no route.
      r.route = x.contains("route") ? x.at("route").get<std::string>() : r.backend;
      r.isa = x.at("isa").get<std::string>();
      r.phase = x.at("phase").get<std::string>();
      // Files written before projection providers existed: projections rows
      // ran the kernel table's GEMM, block rows the layer's route (auto).
      if (x.contains("proj") && !x.at("proj").is_null()) r.proj = x.at("proj").get<std::string>();
      else if (r.phase == "projections") r.proj = r.backend == "reference" ? "auto" : "highway";
      else if (r.phase == "block") r.proj = "auto";
      if (x.contains("proj_route") && !x.at("proj_route").is_null())
        r.proj_route = x.at("proj_route").get<std::string>();
      r.model = x.at("model").get<std::string>();
      r.kind = x.at("kind").get<std::string>();
      r.kv_dtype = x.at("kv_dtype").get<std::string>();
      r.weight_dtype = x.at("weight_dtype").get<std::string>();
      // Files written before compute modes existed were f32 runs.
      r.compute = x.contains("compute") ? x.at("compute").get<std::string>() : "f32";
      r.batch = x.at("batch").get<int>();
      r.new_tokens = x.at("new_tokens").get<int64_t>();
      if (!x.at("context").is_null()) r.context = x.at("context").get<int64_t>();
      r.ms_median = x.at("ms_median").get<double>();
      r.ms_min = x.at("ms_min").get<double>();
      if (!(r.ms_median > 0)) throw std::runtime_error("ms_median");
      rows.push_back(r);
    } catch (const std::exception&) {
      throw InputError("--compare " + path + ": row " + std::to_string(i) +
                       " lacks a field of g3attn bench's row schema or has a wrong type");
    }
    ++i;
  }
  return rows;
}

Comparison compare(const std::vector<Row>& old_rows, const std::vector<Row>& now, double threshold_pct,
                   const std::string& file) {
  Comparison c;
  c.file = file;
  c.threshold_pct = threshold_pct;
  std::map<std::string, const Row*> old_by_id;
  for (const Row& r : old_rows) old_by_id.emplace(r.match_id(), &r);
  std::set<std::string> matched;
  for (const Row& r : now) {
    auto it = old_by_id.find(r.match_id());
    if (it == old_by_id.end()) {
      c.only_new.push_back(r);
      continue;
    }
    matched.insert(it->first);
    CompareLine l;
    l.now = r;
    l.old_ms = it->second->ms_median;
    l.ratio = r.ms_median / l.old_ms;
    l.regression = l.ratio > 1 + threshold_pct / 100;
    if (l.regression) ++c.regressions;
    c.lines.push_back(l);
  }
  for (const Row& r : old_rows)
    if (!matched.count(r.match_id())) c.only_old.push_back(r);
  return c;
}

std::string compare_text(const Comparison& c) {
  std::ostringstream o;
  o << "\ncompare with " << c.file << " (threshold " << num(c.threshold_pct) << "%): " << c.lines.size()
    << " rows matched, " << c.regressions << " regression" << (c.regressions == 1 ? "" : "s") << "\n";
  if (!c.lines.empty()) {
    std::vector<std::vector<std::string>> t = {{"backend", "isa", "proj", "model", "kind", "phase", "kv", "w", "cmp",
                                                "new", "ctx", "old_ms", "new_ms", "new/old", ""}};
    std::vector<bool> right = {false, false, false, false, false, false, false, false, false,
                               true,  true,  true,  true,  true,  false};
    for (const auto& l : c.lines) {
      const Row& x = l.now;
      t.push_back({x.label(), x.isa, x.proj_label(), x.model, x.kind, x.phase, x.kv_dtype, x.weight_dtype, x.compute,
                   std::to_string(x.new_tokens), ctx(x.context), num(l.old_ms), num(x.ms_median), num(l.ratio),
                   l.regression ? "REGRESSION" : ""});
    }
    o << format_table(t, right);
  }
  for (const Row& r : c.only_old) o << "only in " << c.file << ": " << row_label(r) << "\n";
  for (const Row& r : c.only_new) o << "only in this run: " << row_label(r) << "\n";
  return o.str();
}

nlohmann::json to_json(const Result& r, const Comparison* c) {
  nlohmann::json out;
  nlohmann::json m;
  m["cpu"] = cpu_model();
  m["cores"] = std::thread::hardware_concurrency();
  m["threads"] = r.options.threads;
  m["isas_runnable"] = r.isas_runnable;
  m["isas_compiled"] = r.isas_compiled;
  m["backends_built"] = r.backends_built;
  __builtin_cpu_init();
  m["cpu_features"] = {{"avx2", bool(__builtin_cpu_supports("avx2"))},
                       {"fma", bool(__builtin_cpu_supports("fma"))},
                       {"avx512f", bool(__builtin_cpu_supports("avx512f"))},
                       {"avx512bf16", bool(__builtin_cpu_supports("avx512bf16"))},
                       {"avx512vnni", bool(__builtin_cpu_supports("avx512vnni"))}};
  m["llc_bytes"] = llc_bytes();
  m["compiler"] = std::string("g++ ") + __VERSION__;
  std::string flags;
#ifdef __OPTIMIZE__
  flags += "optimised";
#else
  flags += "not optimised";
#endif
#ifdef NDEBUG
  flags += ", NDEBUG";
#endif
#ifdef __SANITIZE_ADDRESS__
  flags += ", AddressSanitizer";
#endif
  flags += ", no global -m flags (per-function targets), HWY_WANT_AVX3_DL";
  m["build_flags"] = flags;
  out["machine"] = m;
  const Peaks& p = r.peaks;
  out["peaks"] = {{"threads", p.threads},
                  {"fp32_gflops", p.fp32_gflops},
                  {"fp32_isa", p.fp32_isa},
                  {"bf16_gflops", opt_json(p.bf16_gflops)},
                  {"amx_gflops", opt_json(p.amx_gflops)},
                  {"amx_unavailable", p.amx_gflops ? nlohmann::json(nullptr) : nlohmann::json(p.amx_unavailable)},
                  {"dram_read_gbs", p.dram_read_gbs},
                  {"dram_bytes", p.dram_bytes}};
  const Options& o = r.options;
  nlohmann::json kv = nlohmann::json::array();
  for (DType d : o.kv_dtypes) kv.push_back(to_string(d));
  nlohmann::json computes = nlohmann::json::array();
  for (DType d : o.computes) computes.push_back(to_string(d));
  out["options"] = {{"models", o.models},      {"isas", o.isas},         {"backends", o.backends},
                    {"phases", o.phases},      {"new_tokens", o.new_tokens}, {"batch", o.batch},
                    {"threads", o.threads},    {"repeat", o.repeat > 0 ? nlohmann::json(o.repeat) : nlohmann::json("auto")},
                    {"kv_dtypes", kv},         {"computes", computes},
                    {"projs", o.projs.empty() ? nlohmann::json("default") : nlohmann::json(o.projs)},
                    {"weight_dtype", to_string(o.weight_dtype)}};
  if (o.contexts.empty())
    out["options"]["contexts"] = {{"prefill", default_prefill_contexts()}, {"decode", default_decode_contexts()}};
  else
    out["options"]["contexts"] = o.contexts;
  nlohmann::json rows = nlohmann::json::array();
  for (const Row& x : r.rows) rows.push_back(row_json(x));
  out["rows"] = rows;
  out["flop_rule"] = flop_rule();
  out["notes"] = r.notes;
  out["seconds"] = r.seconds;
  if (c) {
    nlohmann::json cj;
    cj["file"] = c->file;
    cj["threshold_pct"] = c->threshold_pct;
    cj["regressions"] = c->regressions;
    nlohmann::json lines = nlohmann::json::array();
    for (const auto& l : c->lines) {
      nlohmann::json j = id_json(l.now);
      j["old_ms"] = l.old_ms;
      j["new_ms"] = l.now.ms_median;
      j["ratio"] = l.ratio;
      j["regression"] = l.regression;
      lines.push_back(j);
    }
    cj["rows"] = lines;
    cj["only_in_old"] = nlohmann::json::array();
    for (const Row& x : c->only_old) cj["only_in_old"].push_back(id_json(x));
    cj["only_in_new"] = nlohmann::json::array();
    for (const Row& x : c->only_new) cj["only_in_new"].push_back(id_json(x));
    out["compare"] = cj;
  }
  return out;
}

std::string csv_text(const Result& r) {
  auto o = [](const std::optional<double>& v) {
    if (!v) return std::string();
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", *v);
    return std::string(buf);
  };
  std::string s =
      "backend,isa,model,kind,phase,kv_dtype,weight_dtype,compute,batch,new_tokens,context,ms_median,ms_min,gflops,gbs,"
      "pct_peak,vs_reference,vs_best,proj\n";
  for (const Row& x : r.rows) {
    s += x.label() + "," + x.isa + "," + x.model + "," + x.kind + "," + x.phase + "," + x.kv_dtype + "," +
         x.weight_dtype + "," + x.compute + "," + std::to_string(x.batch) + "," + std::to_string(x.new_tokens) + "," +
         (x.context ? std::to_string(*x.context) : std::string()) + "," + o(x.ms_median) + "," + o(x.ms_min) + "," +
         o(x.gflops) + "," + o(x.gbs) + "," + o(x.pct_peak) + "," + o(x.vs_reference) + "," + o(x.vs_best) + "," + (x.proj.empty() ? std::string() : x.proj_label()) + "\n";
  }
  return s;
}

// A grouped bar chart: one group per shape, one bar per backend/ISA, the
// height in % of the relevant peak so compute and decode rows share an axis.
std::string svg_text(const Result& r) {
  std::vector<std::string> groups, series;
  std::map<std::string, std::string> group_label;
  std::map<std::pair<std::string, std::string>, const Row*> cell;
  for (const Row& x : r.rows) {
    const std::string g = x.shape_id(), s = x.label() + " " + x.isa + (x.proj.empty() ? "" : " proj " + x.proj_label());
    if (!group_label.count(g)) {
      groups.push_back(g);
      group_label[g] = x.model + " " + x.kind + " " + x.phase + " " + (x.context ? "ctx " + ctx(x.context) + " " : "") +
                       "new " + std::to_string(x.new_tokens) + (x.kv_dtype != "any" ? " " + x.kv_dtype : "") +
                       (x.compute != "f32" ? " compute " + x.compute : "");
    }
    if (std::find(series.begin(), series.end(), s) == series.end()) series.push_back(s);
    cell[{g, s}] = &x;
  }
  static const char* colors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
                                 "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#2ca02c", "#d62728", "#9467bd"};
  const int ncolors = int(sizeof colors / sizeof colors[0]);
  const double bar = 12, gap = 18, left = 80, top = 70, plot_h = 320, bottom = 190;
  const double group_w = std::max<double>(1, double(series.size())) * bar + gap;
  const double plot_w = std::max(240.0, double(groups.size()) * group_w);
  const double legend_w = 230;
  const double width = left + plot_w + 30 + legend_w, height = top + plot_h + bottom;
  double vmax = 0;
  for (const Row& x : r.rows) vmax = std::max(vmax, x.pct_peak);
  // A round axis top: 1, 2 or 5 times a power of ten.
  double top_v = 1;
  if (vmax > 0) {
    double p10 = std::pow(10.0, std::floor(std::log10(vmax)));
    top_v = vmax <= p10 ? p10 : vmax <= 2 * p10 ? 2 * p10 : vmax <= 5 * p10 ? 5 * p10 : 10 * p10;
  }
  auto y_of = [&](double v) { return top + plot_h - v / top_v * plot_h; };
  std::ostringstream o;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                "font-family=\"sans-serif\" font-size=\"12\">\n",
                width, height, width, height);
  o << buf;
  o << "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  const Peaks& p = r.peaks;
  std::snprintf(buf, sizeof buf,
                "g3attn bench: %% of peak per shape (%d threads; fp32 FMA %.0f GFLOP/s, DRAM read %.1f GB/s)",
                p.threads, p.fp32_gflops, p.dram_read_gbs);
  o << "<text x=\"" << left << "\" y=\"28\" font-size=\"16\" font-weight=\"bold\">" << xml_escape(buf) << "</text>\n";
  o << "<text x=\"" << left << "\" y=\"48\" fill=\"#555\">" << xml_escape(cpu_model())
    << "; hover a bar for its numbers</text>\n";
  // Grid and y ticks.
  for (int i = 0; i <= 5; ++i) {
    double v = top_v * i / 5, y = y_of(v);
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n"
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                  left, y, left + plot_w, y, left - 6, y + 4, num(v).c_str());
    o << buf;
  }
  std::snprintf(buf, sizeof buf,
                "<text transform=\"translate(22,%.1f) rotate(-90)\" text-anchor=\"middle\">%% of peak (fp32 FMA; "
                "decode rows: DRAM read)</text>\n",
                top + plot_h / 2);
  o << buf;
  // Bars.
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const double gx = left + double(gi) * group_w + gap / 2;
    for (size_t si = 0; si < series.size(); ++si) {
      auto it = cell.find({groups[gi], series[si]});
      if (it == cell.end()) continue;
      const Row& x = *it->second;
      const double y = y_of(x.pct_peak), h = top + plot_h - y;
      std::snprintf(buf, sizeof buf,
                    "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>", gx + double(si) * bar,
                    y, bar - 1, std::max(h, 0.5), colors[si % size_t(ncolors)]);
      o << buf;
      std::string tip = series[si] + ", " + group_label[groups[gi]] + ": " + num(x.pct_peak) + "% of peak, " +
                        num(x.gflops) + " GFLOP/s, " + (x.gbs ? num(*x.gbs) + " GB/s, " : "") + num(x.ms_median) +
                        " ms";
      o << xml_escape(tip) << "</title></rect>\n";
    }
    // Shape label under its group, rotated so long names fit.
    const double cx = gx + double(series.size()) * bar / 2;
    std::snprintf(buf, sizeof buf, "<text transform=\"translate(%.1f,%.1f) rotate(-40)\" text-anchor=\"end\">", cx,
                  top + plot_h + 14);
    o << buf << xml_escape(group_label[groups[gi]]) << "</text>\n";
  }
  // Axes.
  std::snprintf(buf, sizeof buf,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n"
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                left, top, left, top + plot_h, left, top + plot_h, left + plot_w, top + plot_h);
  o << buf;
  std::snprintf(buf, sizeof buf, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">shape (model, layer kind, phase, context, new tokens, KV dtype)</text>\n",
                left + plot_w / 2, height - 12);
  o << buf;
  // Legend.
  const double lx = left + plot_w + 30;
  o << "<text x=\"" << lx << "\" y=\"" << top - 8 << "\" font-weight=\"bold\">backend / ISA</text>\n";
  for (size_t si = 0; si < series.size(); ++si) {
    const double ly = top + double(si) * 18;
    std::snprintf(buf, sizeof buf, "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", lx, ly,
                  colors[si % size_t(ncolors)]);
    o << buf << "<text x=\"" << lx + 18 << "\" y=\"" << ly + 10 << "\">" << xml_escape(series[si]) << "</text>\n";
  }
  if (groups.empty())
    o << "<text x=\"" << left + 20 << "\" y=\"" << top + plot_h / 2 << "\">no rows</text>\n";
  o << "</svg>\n";
  return o.str();
}

}  // namespace g3::bench
