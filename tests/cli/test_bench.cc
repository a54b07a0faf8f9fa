// `g3attn bench` end to end on a tiny shape: the JSON schema, CSV and SVG
// outputs, --compare, and bad input. Timings are never asserted (the
// machine is shared); only that numbers are finite and positive where the
// schema says they must be.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "runtime/bench/bench.h"
#include "generator/xbyak/amx_permission.h"
#include "tests/support/test_support.h"

namespace {

using nlohmann::json;

// The tiny run every case shares: one model, all four phases, reference on
// scalar, one timed run per row. A few seconds, mostly the peaks.
std::vector<std::string> tiny_args() {
  return {"bench", "--model", "1b", "--context", "64", "--new-tokens", "16", "--repeat", "1", "--backend",
          "reference", "--isa", "scalar", "--phase", "all", "--threads", "2"};
}

bool positive_number(const json& v) { return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0; }

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  if (!s.empty() && s.back() != '\n') ++n;
  return n;
}

void check_schema(const json& j) {
  REQUIRE(j.is_object());
  for (const char* k : {"machine", "peaks", "rows", "notes"}) REQUIRE(j.contains(k));
  const json& m = j["machine"];
  for (const char* k : {"cpu", "cores", "threads", "isas_runnable", "isas_compiled", "build_flags"})
    CHECK(m.contains(k));
  const json& p = j["peaks"];
  for (const char* k : {"threads", "fp32_gflops", "bf16_gflops", "dram_read_gbs"}) REQUIRE(p.contains(k));
  CHECK(p["threads"] == 2);
  CHECK(positive_number(p["fp32_gflops"]));
  CHECK(positive_number(p["dram_read_gbs"]));
  CHECK((p["bf16_gflops"].is_null() || positive_number(p["bf16_gflops"])));
  REQUIRE(j["rows"].is_array());
  REQUIRE(!j["rows"].empty());
  std::set<std::string> phases;
  for (const json& r : j["rows"]) {
    for (const char* k : {"backend", "route", "isa", "model", "kind", "phase", "kv_dtype", "weight_dtype", "batch",
                          "new_tokens", "context", "ms_median", "ms_min", "gflops", "gbs", "pct_peak",
                          "vs_reference", "vs_best"})
      REQUIRE(r.contains(k));
    INFO(r.dump());
    CHECK(r["backend"] == "reference");
    CHECK(r["route"] == "reference");
    CHECK(r["isa"] == "scalar");
    CHECK(r["model"] == "1b");
    CHECK(r["batch"] == 1);
    phases.insert(r["phase"].get<std::string>());
    CHECK(positive_number(r["ms_median"]));
    CHECK(positive_number(r["ms_min"]));
    CHECK(r["ms_min"].get<double>() <= r["ms_median"].get<double>());
    CHECK(positive_number(r["gflops"]));
    CHECK(positive_number(r["pct_peak"]));
    // The reference is the only backend here, so it is its own reference
    // and the best of every shape.
    CHECK(r["vs_reference"].get<double>() == Approx(1.0));
    CHECK(r["vs_best"].get<double>() == Approx(1.0));
    if (r["phase"] == "decode") {
      CHECK(r["new_tokens"] == 1);
      CHECK(positive_number(r["gbs"]));
    } else {
      CHECK(r["gbs"].is_null());
    }
    if (r["phase"] == "projections") {
      CHECK(r["context"].is_null());
    } else {
      CHECK(r["context"] == 64);
      CHECK((r["kind"] == "local" || r["kind"] == "global"));
    }
    if (r["phase"] == "prefill") CHECK(r["new_tokens"] == 16);
    // Block rows split their median run into the block's seven stages,
    // which are consecutive parts of that run's timed interval.
    if (r["phase"] == "block") {
      REQUIRE(r["stage_ms"].is_object());
      CHECK(r["stage_ms"].size() == 7);
      double sum = 0;
      for (const char* st : {"cache_slots", "pre_norm", "qkv_projection", "qk_rope_cache", "attention_core",
                             "out_projection", "post_norm"}) {
        INFO(st);
        REQUIRE(r["stage_ms"].contains(st));
        CHECK(r["stage_ms"][st].get<double>() >= 0);
        sum += r["stage_ms"][st].get<double>();
      }
      CHECK(r["stage_ms"]["attention_core"].get<double>() > 0);
      CHECK(sum <= r["ms_median"].get<double>() * (1 + 1e-9));
    } else {
      CHECK(!r.contains("stage_ms"));
    }
  }
  CHECK(phases == std::set<std::string>{"prefill", "decode", "block", "projections"});
}

}  // namespace

TEST_CASE("bench writes JSON, CSV and SVG for a tiny shape, and compares two runs", "[bench]") {
  g3test::TempDir dir;
  const std::string j1 = dir.file("a.json"), j2 = dir.file("b.json"), csv = dir.file("rows.csv"),
                    svg = dir.file("chart.svg");
  auto args = tiny_args();
  for (const auto& s : {"--json", j1.c_str(), "--csv", csv.c_str(), "--svg", svg.c_str()}) args.push_back(s);
  g3test::CmdResult r = g3test::run_g3attn(args);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  // With --json FILE the table still goes to stdout, with the FLOP rule.
  CHECK(r.out.find("peaks (2 threads)") != std::string::npos);
  CHECK(r.out.find("ms_med") != std::string::npos);
  CHECK(r.out.find("4 x dh x N_heads") != std::string::npos);

  json a = json::parse(g3test::read_text(j1));
  check_schema(a);
  const size_t nrows = a["rows"].size();

  // CSV: the header, then one line per JSON row with the same field count.
  std::stringstream cs(g3test::read_text(csv));
  std::string line;
  std::getline(cs, line);
  CHECK(line ==
        "backend,isa,model,kind,phase,kv_dtype,weight_dtype,compute,batch,new_tokens,context,ms_median,ms_min,"
        "gflops,gbs,pct_peak,vs_reference,vs_best,proj");
  size_t lines = 0;
  while (std::getline(cs, line)) {
    if (line.empty()) continue;
    ++lines;
    CHECK(std::count(line.begin(), line.end(), ',') == 18);
    CHECK(line.rfind("reference,scalar,1b,", 0) == 0);
  }
  CHECK(lines == nrows);

  // SVG: one document, a bar per row, a legend entry, axis labels.
  std::string s = g3test::read_text(svg);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  CHECK(s.rfind("<svg", 0) == 0);
  CHECK(s.size() >= 6);
  CHECK(s.substr(s.size() - 6) == "</svg>");
  size_t titles = 0;
  for (size_t p = s.find("<title>"); p != std::string::npos; p = s.find("<title>", p + 1)) ++titles;
  CHECK(titles == nrows);
  CHECK(s.find("reference scalar") != std::string::npos);
  CHECK(s.find("% of peak") != std::string::npos);
  CHECK(std::count(s.begin(), s.end(), '<') == std::count(s.begin(), s.end(), '>'));

  // A second run compared with the first: every row matches, none missing.
  auto args2 = tiny_args();
  for (const auto& x : {"--json", j2.c_str(), "--compare", j1.c_str(), "--threshold", "5"}) args2.push_back(x);
  g3test::CmdResult r2 = g3test::run_g3attn(args2);
  INFO(r2.err);
  REQUIRE(r2.exit_code == 0);
  CHECK(r2.out.find("compare with " + j1) != std::string::npos);
  CHECK(r2.out.find(std::to_string(nrows) + " rows matched") != std::string::npos);
  CHECK(r2.out.find("only in") == std::string::npos);
  json b = json::parse(g3test::read_text(j2));
  check_schema(b);
  REQUIRE(b.contains("compare"));
  CHECK(b["compare"]["rows"].size() == nrows);
  CHECK(b["compare"]["threshold_pct"].get<double>() == Approx(5));
  CHECK(b["compare"]["only_in_old"].empty());
  CHECK(b["compare"]["only_in_new"].empty());
  for (const json& x : b["compare"]["rows"]) {
    CHECK(positive_number(x["ratio"]));
    CHECK(x["regression"].is_boolean());
  }

  // Rows missing on one side are listed: compare the full run with a
  // decode-only one.
  auto args3 = tiny_args();
  args3[14] = "decode";
  for (const auto& x : {"--compare", j1.c_str()}) args3.push_back(x);
  g3test::CmdResult r3 = g3test::run_g3attn(args3);
  INFO(r3.err);
  REQUIRE(r3.exit_code == 0);
  CHECK(r3.out.find("2 rows matched") != std::string::npos);
  CHECK(r3.out.find("only in " + j1 + ": reference scalar 1b") != std::string::npos);
  CHECK(g3test::count_entries(dir.path) == 4);  // no temporary files left behind
}

TEST_CASE("bench --json alone prints only JSON on stdout", "[bench]") {
  auto args = tiny_args();
  args[14] = "decode";
  args.push_back("--json");
  g3test::CmdResult r = g3test::run_g3attn(args);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  json j = json::parse(r.out);
  CHECK(j["rows"].size() == 2);  // local and global
}

TEST_CASE("bench skips ISAs and backends it cannot run with a note, never an error", "[bench]") {
  // Every ISA name and every backend: whatever this build and CPU lack is
  // a note. Decode on a tiny context keeps it short.
  g3test::CmdResult r = g3test::run_g3attn({"bench", "--model", "1b", "--context", "64", "--phase", "decode",
                                            "--repeat", "1", "--isa", "all", "--backend", "all", "--json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  json j = json::parse(r.out);
  REQUIRE(!j["rows"].empty());
  for (const json& row : j["rows"]) {
    CHECK(row["backend"] != "auto");  // "all" is the four backends; auto is asked for by name
    CHECK(row["route"] == row["backend"]);
    CHECK(positive_number(row["ms_median"]));
    CHECK(positive_number(row["vs_best"]));
    CHECK(row["vs_best"].get<double>() <= 1.0 + 1e-9);
    CHECK(positive_number(row["vs_reference"]));  // the reference ran every shape
  }
  for (const std::string isa : {"scalar", "ssse3", "sse4", "avx2", "avx3", "avx3_dl"}) {
    bool row = false, note = false;
    for (const json& x : j["rows"]) row = row || x["isa"] == isa;
    for (const json& n : j["notes"]) note = note || n.get<std::string>().find(isa) != std::string::npos;
    INFO(isa);
    CHECK((row || note));
  }
}

TEST_CASE("bench --backend auto measures the route users get and names it per row", "[bench][auto]") {
  // f32 KV: README's auto rule takes highway, on every ISA asked for (in
  // a cache directory of its own, so no tune profile of this machine's
  // replaces the rule).
  const std::string route = "highway";
  g3test::TempDir dir;
  const std::string csv = dir.file("rows.csv");
  g3test::CmdResult r = g3test::run_g3attn({"bench", "--model", "1b", "--context", "64", "--new-tokens", "16",
                                            "--repeat", "1", "--isa", "scalar", "--phase", "decode", "--threads",
                                            "2", "--backend", "auto,reference", "--json", "--csv", csv},
                                           "G3ATTN_CACHE_DIR='" + dir.path + "'");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  json j = json::parse(r.out);
  int auto_rows = 0;
  for (const json& row : j["rows"]) {
    INFO(row.dump());
    if (row["backend"] == "auto") {
      ++auto_rows;
      CHECK(row["route"] == route);
      CHECK(row["isa"] == "scalar");
      CHECK(row["stages"]["core"] == route);
      CHECK(positive_number(row["ms_median"]));
    } else {
      CHECK(row["backend"] == "reference");
      CHECK(row["route"] == "reference");
    }
  }
  CHECK(auto_rows == 2);  // local and global
  // The table and the CSV show the route in the backend column.
  const std::string label = "auto(" + route + ")";
  CHECK(g3test::read_text(csv).find("\n" + label + ",scalar,1b,") != std::string::npos);
  g3test::CmdResult t = g3test::run_g3attn({"bench", "--model", "1b", "--context", "64", "--repeat", "1", "--isa",
                                            "scalar", "--phase", "decode", "--threads", "2", "--backend", "auto"},
                                           "G3ATTN_CACHE_DIR='" + dir.path + "'");
  INFO(t.err);
  REQUIRE(t.exit_code == 0);
  CHECK(t.out.find(label + " ") != std::string::npos);
  // --help documents it.
  g3test::CmdResult h = g3test::run_g3attn({"bench", "--help"});
  CHECK(h.exit_code == 0);
  CHECK(h.out.find("auto(highway)") != std::string::npos);
}

TEST_CASE("bench: an auto row and its route's own row are one measurement, in either order", "[bench][auto]") {
  // Without a profile, auto takes highway for f32 KV (README's rule).
  g3test::TempDir dir;
  for (const char* order : {"highway,auto", "auto,highway"}) {
    INFO(order);
    g3test::CmdResult r = g3test::run_g3attn({"bench", "--model", "1b", "--context", "64", "--repeat", "2", "--isa",
                                              "scalar", "--phase", "decode", "--threads", "2", "--backend", order,
                                              "--json"},
                                             "G3ATTN_CACHE_DIR='" + dir.path + "'");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const json j = json::parse(r.out);
    std::map<std::string, std::map<std::string, double>> ms;  // kind -> backend -> ms
    for (const json& row : j["rows"]) {
      CHECK(row["route"] == "highway");
      ms[row["kind"].get<std::string>()][row["backend"].get<std::string>()] = row["ms_median"].get<double>();
    }
    REQUIRE(ms.size() == 2);  // local and global
    for (const auto& [kind, by] : ms) {
      INFO(kind);
      REQUIRE(by.size() == 2);
      CHECK(by.at("auto") == by.at("highway"));
    }
    bool noted = false;
    for (const json& n : j["notes"]) noted |= n.get<std::string>().find("auto's rows run the code") != std::string::npos;
    CHECK(noted);
  }
}

TEST_CASE("bench times a shape's rows side by side, round after round", "[bench]") {
  // Two backends on two ISAs of scalar-capable code, three runs each: every
  // row's timed runs must overlap every other row's of the same shape (one
  // run each in turn), and shapes follow one another.
  g3test::CmdResult r = g3test::run_g3attn({"bench", "--model", "1b", "--context", "64", "--new-tokens", "16",
                                            "--repeat", "3", "--isa", "scalar,best", "--phase", "prefill,decode",
                                            "--threads", "2", "--backend", "reference,highway", "--json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json j = json::parse(r.out);
  std::map<std::string, std::vector<json>> by_shape;
  for (const json& row : j["rows"]) {
    REQUIRE(row.contains("timed_from_s"));
    REQUIRE(row.contains("timed_to_s"));
    CHECK(row["runs"] == 3);
    CHECK(row["timed_from_s"].get<double>() > 0);
    CHECK(row["timed_from_s"].get<double>() <= row["timed_to_s"].get<double>());
    by_shape[row["phase"].get<std::string>() + "|" + row["kind"].get<std::string>()].push_back(row);
  }
  REQUIRE(by_shape.size() == 4);
  std::vector<std::pair<double, double>> spans;  // per shape: first start, last end
  for (const auto& [shape, rows] : by_shape) {
    INFO(shape);
    // highway under scalar and best, and the reference (once, as scalar).
    REQUIRE(rows.size() >= 2);
    double from = 1e30, to = 0;
    for (const json& a : rows) {
      from = std::min(from, a["timed_from_s"].get<double>());
      to = std::max(to, a["timed_to_s"].get<double>());
      for (const json& b : rows)
        CHECK(a["timed_from_s"].get<double>() < b["timed_to_s"].get<double>());
    }
    spans.emplace_back(from, to);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) CHECK(spans[i - 1].second <= spans[i].first);
}

TEST_CASE("bench rejects bad input with exit code 2 and one line", "[bench]") {
  struct Bad {
    std::vector<std::string> args;
    std::string needle;
  };
  const std::vector<Bad> cases = {
      {{"bench", "--isa", "avx9"}, "avx9"},
      {{"bench", "--isa", "scalar,bogus"}, "bogus"},
      {{"bench", "--isa", "scalar,,best"}, "--isa: empty element in 'scalar,,best'"},
      {{"bench", "--model", "1b,,4b"}, "--model: empty element in '1b,,4b'"},
      {{"bench", "--context", "4096,"}, "--context: empty element in '4096,'"},
      {{"bench", "--phase", "warmup"}, "warmup"},
      {{"bench", "--repeat", "0"}, "--repeat"},
      {{"bench", "--backend", "cuda"}, "cuda"},
      {{"bench", "--model", "2b"}, "2b"},
      {{"bench", "--kv-dtype", "f16"}, "f16"},
      {{"bench", "--context", "64", "--new-tokens", "128"}, "--new-tokens"},
      {{"bench", "--context", "abc"}, "abc"},
      {{"bench", "--threshold", "5"}, "--compare"},
      {{"bench", "--compare", "/nonexistent/old.json"}, "/nonexistent/old.json"},
      {{"bench", "--compare", "/"}, "--compare /: is a directory"},
      {{"bench", "--csv", "/nonexistent/dir/x.csv"}, "/nonexistent/dir"},
      {{"bench", "--threads", "0"}, "--threads"},
      {{"bench", "--compute", "f32,f16"}, "f16"},
      {{"bench", "--proj", "mkl"}, "mkl"},
  };
  for (const Bad& b : cases) {
    g3test::CmdResult r = g3test::run_g3attn(b.args);
    INFO(b.args[1] << " " << b.args[2] << " -> " << r.err);
    CHECK(r.exit_code == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find(b.needle) != std::string::npos);
    CHECK(r.out.empty());
  }
  // An unknown ISA lists the valid names.
  g3test::CmdResult u = g3test::run_g3attn({"bench", "--isa", "avx9"});
  CHECK(u.err.find("valid: scalar, ssse3, sse4, avx2, avx3, avx3_dl, best, all") != std::string::npos);
  // A --compare file that is not a bench JSON.
  g3test::TempDir dir;
  g3test::write_text(dir.file("x.json"), "{\"rows\": 3}");
  g3test::CmdResult r = g3test::run_g3attn({"bench", "--compare", dir.file("x.json")});
  CHECK(r.exit_code == 2);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("rows") != std::string::npos);
}

TEST_CASE("bench --proj all --compute f32,bf16: projections rows per provider and mode, block rows on auto's route",
          "[bench][proj]") {
  // 32 tokens are a prefill-sized call (more than 16 rows), 1 token a
  // decode-sized one; both run for each mode and provider.
  const g3test::CmdResult r = g3test::run_g3attn({"bench", "--model", "1b", "--context", "64", "--new-tokens", "32",
                                                  "--repeat", "1", "--backend", "highway", "--isa", "best",
                                                  "--phase", "projections", "--threads", "2", "--compute", "f32,bf16",
                                                  "--proj", "all", "--json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json j = json::parse(r.out);
  std::set<std::string> seen;
  for (const json& row : j["rows"]) {
    REQUIRE(row["phase"] == "projections");
    const std::string proj = row["proj"], route = row["proj_route"], compute = row["compute"];
    // An explicit provider is the one that ran.
    CHECK(route == proj);
    seen.insert(proj + "|" + compute + "|" + std::to_string(row["new_tokens"].get<int64_t>()));
    CHECK(positive_number(row["ms_median"]));
  }
  std::set<std::string> want;
  for (const char* p : {"highway", "onednn"})
    for (const char* c : {"f32", "bf16"})
      for (const char* t : {"32", "1"}) want.insert(std::string(p) + "|" + c + "|" + t);
  CHECK(seen == want);

  // Block rows default to auto and name the provider auto chose: oneDNN for
  // the bf16 prefill call only where AMX tiles are allowed (the default
  // rule; this test's cache directory holds no tune profile).
  g3test::TempDir dir;
  const g3test::CmdResult b = g3test::run_g3attn(
      {"bench", "--model", "1b", "--context", "64", "--new-tokens", "32", "--repeat", "1", "--backend", "highway",
       "--isa", "best", "--phase", "block", "--threads", "2", "--compute", "bf16", "--json"},
      "G3ATTN_CACHE_DIR='" + dir.path + "'");
  INFO(b.err);
  REQUIRE(b.exit_code == 0);
  const json jb = json::parse(b.out);
  REQUIRE(!jb["rows"].empty());
  const bool amx = g3::amx::unavailable_reason().empty();
  for (const json& row : jb["rows"]) {
    CHECK(row["proj"] == "auto");
    const bool prefill = row["new_tokens"].get<int64_t>() > 16;
    CHECK(row["proj_route"] == (prefill && amx ? "onednn" : "highway"));
  }
  // The 1-token rows ran with cold caches, as a decode step finds a layer,
  // and the notes say so.
  bool cold_note = false;
  for (const json& n : jb["notes"]) cold_note |= n.get<std::string>().find("cold caches") != std::string::npos;
  CHECK(cold_note);
}
