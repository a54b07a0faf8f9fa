// `g3attn tune` and the profile `auto` follows (runtime/dispatch/profile.h,
// runtime/bench/tune.h): the choice rule on given rows, a real tune run
// writing a profile that plan then reads, and the profiles auto must refuse
// (corrupt, foreign, stale) with one warning and the static rule. Timings
// are never asserted; each process reads the profile of its own
// G3ATTN_CACHE_DIR.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include "generator/errors.h"
#include "runtime/bench/tune.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/onednn_matmul.h"
#include "runtime/dispatch/prefetch_route.h"
#include "runtime/dispatch/profile.h"
#include "runtime/exec/block.h"
#include "tests/support/test_support.h"

namespace {

using nlohmann::json;

g3::bench::Row row(const std::string& backend, const std::string& phase, int64_t ctx, double ms) {
  g3::bench::Row r;
  r.backend = r.route = backend;
  r.key = "k";
  r.isa = r.isa_cap = "avx3";
  r.phase = phase;
  r.context = ctx;
  r.ms_median = ms;
  return r;
}

std::string env_for(const g3test::TempDir& d) { return "G3ATTN_CACHE_DIR='" + d.path + "'"; }

// An empty profile valid for this CPU and version.
g3::Profile this_cpu_profile() {
  g3::Profile p;
  p.version = g3::g3attn_version();
  p.cpu = g3::this_cpu().id();
  p.threads = 2;
  return p;
}

// The profile file this CPU uses under `dir` (its name hashes the CPU).
std::string profile_in(const g3test::TempDir& d) {
  const std::string mine = g3::profile_path();
  REQUIRE(!mine.empty());
  return d.path + "/" + mine.substr(mine.rfind('/') + 1);
}

}  // namespace

TEST_CASE("tune keeps, per key, phase and ISA, the backend fastest relative to each context", "[tune]") {
  // xbyak wins the long context by a little, highway the short one by a lot:
  // every context counts alike, so highway has the lower score.
  std::vector<g3::bench::Row> rows = {row("highway", "decode", 4096, 1.0), row("xbyak", "decode", 4096, 2.0),
                                      row("highway", "decode", 32768, 10.5), row("xbyak", "decode", 32768, 10.0),
                                      row("highway", "prefill", 4096, 5.0), row("llvm", "prefill", 4096, 4.0),
                                      row("reference", "prefill", 4096, 1.0), row("auto", "prefill", 4096, 0.5)};
  const auto entries = g3::bench::entries_from_passes({rows});
  REQUIRE(entries.size() == 2);
  // A local layer's calls do the same work past the window: one winner.
  for (g3::bench::Row& r : rows) r.kind = "local";
  for (const g3::ProfileEntry& e : g3::bench::entries_from_passes({rows})) CHECK(e.ms_at.empty());
  for (const g3::ProfileEntry& e : entries) {
    if (e.phase == g3::Phase::Decode) {
      CHECK(e.best == "highway");
      CHECK(e.rel.at("highway") == Approx(1.0 + 10.5 / 10.0));
      CHECK(e.rel.at("xbyak") == Approx(2.0 + 1.0));
      CHECK(e.ms.at("xbyak") == Approx(12.0));
      // Each backend's time at each context, for routes by context.
      CHECK(e.ms_at == std::map<int64_t, std::map<std::string, double>>{{4096, {{"highway", 1.0}, {"xbyak", 2.0}}},
                                                                      {32768, {{"highway", 10.5}, {"xbyak", 10.0}}}});
    } else {
      // The reference and auto rows are never candidates.
      CHECK(e.best == "llvm");
      CHECK(e.ms.size() == 2);
      CHECK(e.margin() == Approx(0.25));
    }
  }
}

TEST_CASE("a route by context switches where the measured time ratio crosses 1, never on a near-tie", "[tune]") {
  auto all = [](const std::string&) { return true; };
  g3::ProfileEntry e;
  e.best = "highway";
  // xbyak 1.25x faster at 4096, Highway 1.5x faster at 32768: ln(1.25) /
  // (ln(1.25) + ln(1.5)) = 0.355 of the way from 4096 to 32768 in log
  // context, 4096 * 8^0.355 = 8570.
  e.ms_at = {{4096, {{"highway", 1.0}, {"xbyak", 0.8}}}, {32768, {{"highway", 2.0}, {"xbyak", 3.0}}}};
  std::vector<g3::ContextRoute> r = g3::context_routes(e, all);
  REQUIRE(r.size() == 2);
  CHECK(r[0].from == 0);
  CHECK(r[0].route.backend == "xbyak");
  CHECK(r[0].route.source == "profile: 1.25x highway at context 4096");
  CHECK(r[1].route.backend == "highway");
  CHECK(std::abs(double(r[1].from) - 4096 * std::pow(8.0, std::log(1.25) / std::log(1.25 * 1.5))) <= 1.0);
  // Within the near-tie at 4096 (xbyak 3% faster): one backend throughout.
  e.ms_at[4096]["xbyak"] = 0.97;
  CHECK(g3::context_routes(e, all).empty());
  // An entry whose passes disagreed by 30% does not switch for 25% either.
  e.ms_at[4096]["xbyak"] = 0.8;
  e.tie = 0.3;
  CHECK(g3::context_routes(e, all).empty());
  e.tie = g3::kContextTie;
  // A winner that cannot run here is no candidate.
  e.ms_at[4096]["xbyak"] = 0.5;
  CHECK(g3::context_routes(e, [](const std::string& n) { return n != "xbyak"; }).empty());
  // Three contexts, the middle one's winner differs: three ranges, each
  // switch between its neighbours.
  e.ms_at = {{1024, {{"highway", 1.0}, {"llvm", 1.2}}},
             {4096, {{"highway", 1.0}, {"llvm", 0.5}}},
             {32768, {{"highway", 1.0}, {"llvm", 2.0}}}};
  r = g3::context_routes(e, all);
  REQUIRE(r.size() == 3);
  CHECK(r[0].route.backend == "highway");
  CHECK(r[1].route.backend == "llvm");
  CHECK((r[1].from > 1024 && r[1].from < 4096));
  CHECK(r[2].route.backend == "highway");
  CHECK((r[2].from > 4096 && r[2].from < 32768));
}

TEST_CASE("auto leaves the static rule only for a lead above the noise of tune's passes", "[tune]") {
  g3::ProfileEntry e;
  e.best = "llvm";
  e.rel = {{"llvm", 2.0}, {"highway", 2.08}, {"xbyak", 3.0}};
  e.ms_at = {{4096, {{"llvm", 1.0}, {"highway", 1.04}}}, {32768, {{"llvm", 1.0}, {"highway", 1.04}}}};
  e.tie = 0.05;
  CHECK(g3::profile_choice(e, "highway") == "highway");  // 4% ahead: inside the tie
  e.tie = 0.03;
  CHECK(g3::profile_choice(e, "highway") == "llvm");
  CHECK(g3::profile_choice(e, "llvm") == "llvm");
  CHECK(g3::profile_choice(e, "amx") == "llvm");  // the rule's backend was not measured
  // Nor when a context lacks it (a hand-edited file).
  e.tie = 0.05;
  e.ms_at[4096].erase("highway");
  CHECK(g3::profile_choice(e, "highway") == "llvm");
  // A route by context starts from that choice: measured on every layer
  // kind, the tie is there on local entries too.
  std::vector<g3::bench::Row> rows = {row("highway", "decode", 4096, 1.0), row("llvm", "decode", 4096, 0.98)};
  for (g3::bench::Row& r : rows) r.kind = "local";
  std::vector<g3::bench::Row> again = rows;
  again[1].ms_median = 1.2;
  const auto entries = g3::bench::entries_from_passes({rows, again});
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].best == "highway");  // (0.98 / 0.98 + 1.2 / 1.0) / 2 = 1.1 against (1 / 0.98 + 1) / 2
  CHECK(entries[0].tie == Approx(1.2 - 1));  // llvm's spread, the larger of the two: 1.2 / 1.0 - 1
}

TEST_CASE("over several passes, backends are compared within each pass and the median ratio kept", "[tune]") {
  // Highway is 10% ahead of xbyak in two passes; in the third, a quiet
  // moment on xbyak's runs puts it 5% ahead. Each row's fastest pass taken
  // apart would make xbyak the winner (0.95 against 1.0); pass by pass,
  // Highway's median is 1 (the fastest), xbyak's 1.1.
  auto pass = [](double hw, double xb) {
    return std::vector<g3::bench::Row>{row("highway", "decode", 4096, hw), row("xbyak", "decode", 4096, xb)};
  };
  std::vector<std::vector<g3::bench::Row>> passes = {pass(1.0, 1.1), pass(2.0, 2.2), pass(1.0, 0.95)};
  auto entries = g3::bench::entries_from_passes(passes);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].best == "highway");
  CHECK(entries[0].rel.at("highway") == Approx(1.0));
  CHECK(entries[0].rel.at("xbyak") == Approx(1.1));
  CHECK(entries[0].ms.at("xbyak") == Approx(1.1));  // the median time over the passes
  CHECK(entries[0].ms_at.at(4096).at("highway") == Approx(1.0));
  // The tie: the median of each (context, backend)'s slowest / fastest
  // relative time over the passes, less 1: Highway 1 / 0.95 and xbyak 1.1.
  CHECK(entries[0].tie == Approx(0.1));
  // Passes that agree (to within 1%) keep the least tie.
  const auto agreed = g3::bench::entries_from_passes({pass(1.0, 1.1), pass(2.0, 2.2), pass(1.0, 1.105)});
  REQUIRE(agreed.size() == 1);
  CHECK(agreed[0].tie == g3::kContextTie);
  // One pass that slowed Highway's rows alone (1.6x) does not decide: the
  // mean would make xbyak the winner, (1.1 + 1.1 + 1) / 3 = 1.067 against
  // (1 + 1 + 1.6) / 3 = 1.2.
  entries = g3::bench::entries_from_passes({pass(1.0, 1.1), pass(1.0, 1.1), pass(1.6, 1.0)});
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].best == "highway");
  CHECK(entries[0].margin() == Approx(0.1));
  // Two passes: the median is their mean.
  entries = g3::bench::entries_from_passes({pass(1.0, 1.1), pass(1.0, 1.3)});
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].rel.at("xbyak") == Approx(1.2));
  CHECK(entries[0].ms_at.at(4096).at("xbyak") == Approx(1.2));
  // A pass that did not reach a context, and one that measured only one
  // backend there: every backend keeps the passes that measured it, and
  // each context weighs the same.
  passes = {{row("highway", "decode", 4096, 1.0), row("xbyak", "decode", 4096, 2.0),
             row("highway", "decode", 32768, 10.0), row("xbyak", "decode", 32768, 9.0)},
            {row("highway", "decode", 4096, 1.0), row("xbyak", "decode", 4096, 2.0)},
            {row("highway", "decode", 32768, 10.0)}};
  entries = g3::bench::entries_from_passes(passes);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].rel.at("highway") == Approx(1.0 + (10.0 / 9.0 + 1.0) / 2));
  CHECK(entries[0].rel.at("xbyak") == Approx(2.0 + 1.0));
  CHECK(entries[0].best == "highway");
  // A backend that no pass measured at some context is no candidate.
  passes = {{row("highway", "decode", 4096, 1.0), row("xbyak", "decode", 4096, 0.5),
             row("highway", "decode", 32768, 10.0)}};
  entries = g3::bench::entries_from_passes(passes);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].best == "highway");
  CHECK(entries[0].rel.count("xbyak") == 0);
}

TEST_CASE("a JIT that runs the same code under a higher ISA cap is a candidate of that cap too", "[tune]") {
  // xbyak has no avx3_dl code: under that cap it runs its avx3 kernels. The
  // bench measures them once, as avx3, and hands tune the same row for
  // avx3_dl, so auto's choice under avx3_dl can be xbyak.
  if (!g3test::backend_runs_here("xbyak", "avx3") || !g3test::backend_runs_here("highway", "avx3_dl")) return;
  g3::bench::Options o;
  o.models = {"1b"};
  o.isas = {"avx3", "avx3_dl"};
  o.backends = {"xbyak"};
  o.phases = {"decode"};
  o.contexts = {4096};
  o.threads = 2;
  o.repeat = 1;
  const g3::bench::Result r = g3::bench::run_bench(o);
  REQUIRE(r.rows.size() == 2);  // local and global, measured once each
  REQUIRE(r.same_code.size() == 2);
  for (const g3::bench::Row& s : r.same_code) {
    CHECK(s.backend == "xbyak");
    CHECK(s.isa_cap == "avx3_dl");
    CHECK(s.isa == "avx3");
  }
  std::vector<g3::bench::Row> all = r.rows;
  all.insert(all.end(), r.same_code.begin(), r.same_code.end());
  int under_dl = 0;
  for (const g3::ProfileEntry& e : g3::bench::entries_from_passes({all}))
    if (e.isa == "avx3_dl") {
      ++under_dl;
      CHECK(e.best == "xbyak");
    }
  CHECK(under_dl == 2);
}

TEST_CASE("where a profile's winners differ by context, each call runs the winner of the nearest context measured",
          "[tune][cli]") {
  g3test::TempDir dir;
  const g3test::CmdResult keys =
      g3test::run_g3attn({"plan", "--model", "270m", "--isa", "scalar", "--json"}, env_for(dir));
  REQUIRE(keys.exit_code == 0);
  // Decode: the reference twice as fast at context 8, Highway twice as fast
  // at 128; their time ratio crosses 1 midway in log context, at 32.
  // Prefill has one winner.
  g3::Profile p = this_cpu_profile();
  const json layers = json::parse(keys.out)["layers"];
  REQUIRE(!layers.empty());
  for (const json& l : layers) {
    if (p.find(l["key"].get<std::string>(), g3::Phase::Decode, "scalar")) continue;
    for (g3::Phase ph : {g3::Phase::Prefill, g3::Phase::Decode}) {
      g3::ProfileEntry e;
      e.key = l["key"].get<std::string>();
      e.isa = "scalar";
      e.phase = ph;
      e.best = "highway";
      e.ms = {{"highway", 1.0}, {"reference", 1.0}};
      e.rel = {{"highway", 2.0}, {"reference", 2.0}};
      e.ms_at = ph == g3::Phase::Decode
                    ? std::map<int64_t, std::map<std::string, double>>{{8, {{"highway", 2.0}, {"reference", 1.0}}},
                                                                       {128, {{"highway", 1.0}, {"reference", 2.0}}}}
                    : std::map<int64_t, std::map<std::string, double>>{{8, {{"highway", 1.0}, {"reference", 2.0}}},
                                                                       {128, {{"highway", 1.0}, {"reference", 2.0}}}};
      p.entries.push_back(e);
    }
  }
  p.entries.at(1).tie = 0.125;
  g3::save_profile(p, profile_in(dir));
  CHECK(g3::load_profile(profile_in(dir)).entries.at(1).ms_at == p.entries.at(1).ms_at);
  CHECK(g3::load_profile(profile_in(dir)).entries.at(1).tie == 0.125);
  p.entries.at(1).tie = g3::kContextTie;
  g3::save_profile(p, profile_in(dir));

  const g3test::CmdResult pl =
      g3test::run_g3attn({"plan", "--model", "270m", "--isa", "scalar", "--json"}, env_for(dir));
  INFO(pl.err);
  REQUIRE(pl.exit_code == 0);
  const json planned = json::parse(pl.out)["layers"];
  REQUIRE(planned.size() == layers.size());
  for (const json& l : planned) {
    CHECK(l["decode_backend"] == "highway");
    CHECK_FALSE(l["by_context"].contains("prefill"));
    REQUIRE(l["by_context"]["decode"].size() == 2);
    CHECK(l["by_context"]["decode"][0]["from"] == 0);
    CHECK(l["by_context"]["decode"][0]["backend"] == "reference");
    CHECK(l["by_context"]["decode"][1]["from"] == 32);
    CHECK(l["by_context"]["decode"][1]["backend"] == "highway");
  }
  // Decode steps from context 17 to 48 cross the switch; the stack still
  // equals the reference stack.
  const g3test::CmdResult r =
      g3test::run_g3attn({"run", "--model", "270m", "--prompt", "16", "--decode", "32", "--chunk", "16", "--isa",
                          "scalar", "--threads", "2", "--verify", "--json", dir.file("run.json")},
                         env_for(dir));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(json::parse(g3test::read_text(dir.file("run.json")))["verify"]["max_abs_diff"].get<double>() <= 1e-3);

  // The choice itself: the last range whose start the context reaches, in
  // the phase of the call's size.
  g3::PreparedLayer L;
  L.kernels.backend = "llvm";
  L.decode.backend = "xbyak";
  g3::PreparedLayer::AtContext ref, hwy;
  ref.choice.backend = "reference";
  hwy.from = 32;
  hwy.choice.backend = "highway";
  L.by_context[size_t(g3::Phase::Decode)] = {ref, hwy};
  CHECK(L.for_call(1, 8, 31).backend == "reference");
  CHECK(L.for_call(8, 8, 32).backend == "highway");
  CHECK(L.for_call(9, 8, 32).backend == "llvm");
  L.by_context[size_t(g3::Phase::Decode)].clear();
  CHECK(L.for_call(1, 8, 100).backend == "xbyak");

  // A profile edited to `text` is no profile: plan warns with `why` and
  // keeps the static rule.
  std::string text = g3test::read_text(profile_in(dir));
  auto refused = [&](const std::string& why) {
    g3test::write_text(profile_in(dir), text);
    const g3test::CmdResult bad =
        g3test::run_g3attn({"plan", "--model", "270m", "--isa", "scalar", "--json"}, env_for(dir));
    INFO(bad.err);
    REQUIRE(bad.exit_code == 0);
    CHECK(bad.err.find(why) != std::string::npos);
    CHECK(json::parse(bad.out)["layers"][0]["source"] == "static rule");
  };
  // A context that is not a positive integer.
  text.replace(text.find("\"8\""), 3, "\"8x\"");
  refused("is not a positive integer");
  // A time at a context that is not a positive number.
  text.replace(text.find("\"8x\""), 4, "\"8\"");
  text.replace(text.find("\"reference\": 2.0", text.find("\"ms_at\"")), 16, "\"reference\": -2.0");
  refused("that is not a positive number");
  // A tie that is not a fraction.
  text.replace(text.find("\"reference\": -2.0"), 17, "\"reference\": 2.0");
  text.replace(text.find("\"tie\": 0.05"), 11, "\"tie\": -0.5");
  refused("has a tie that is not a fraction between 0 and 1");
}

TEST_CASE("g3attn tune measures both KV types by default", "[tune][cli]") {
  // The smallest model, one pass and a budget it does not reach: the
  // entries are what the defaults ask for, whatever the machine's load.
  g3test::TempDir dir;
  const g3test::CmdResult t = g3test::run_g3attn(
      {"tune", "--model", "270m", "--isa", "best", "--rounds", "1", "--budget", "600", "--json"}, env_for(dir));
  INFO(t.err);
  REQUIRE(t.exit_code == 0);
  const json j = json::parse(t.out);
  std::set<std::string> kv;
  for (const json& e : j["entries"]) {
    const std::string key = e["key"].get<std::string>();
    const size_t at = key.find("_kv") + 3;
    kv.insert(key.substr(at, key.rfind("_w") - at));
  }
  CHECK(kv == std::set<std::string>{"f32", "bf16"});
}

TEST_CASE("g3attn tune writes a profile that plan and auto follow", "[tune][cli]") {
  g3test::TempDir dir;
  const g3test::CmdResult t =
      g3test::run_g3attn({"tune", "--model", "1b", "--budget", "8", "--threads", "2", "--json"}, env_for(dir));
  INFO(t.err);
  REQUIRE(t.exit_code == 0);
  const json j = json::parse(t.out);
  REQUIRE(j["entries"].is_array());
  REQUIRE(!j["entries"].empty());
  const g3::Profile p = g3::load_profile(j["profile"].get<std::string>());
  CHECK(p.cpu == g3::this_cpu().id());
  CHECK(p.version == g3::g3attn_version());
  // Plan with auto names the profile as the source of every layer it
  // covers, and gives no hint to tune.
  const g3test::CmdResult pl = g3test::run_g3attn({"plan", "--model", "1b", "--json"}, env_for(dir));
  REQUIRE(pl.exit_code == 0);
  const json plan = json::parse(pl.out);
  CHECK_FALSE(plan.contains("hint"));
  int from_profile = 0;
  for (const json& l : plan["layers"]) {
    const g3::ProfileEntry* e =
        p.find(l["key"].get<std::string>(), g3::Phase::Prefill, g3::best_isa());
    if (!e) continue;
    ++from_profile;
    // The winner, unless the static rule's backend (Highway, for these f32
    // keys) came within the noise of tune's passes (profile_choice): a
    // near-tie under a loaded test run otherwise failed this check.
    CHECK(l["backend"] == g3::profile_choice(*e, "highway"));
    CHECK(l["source"].get<std::string>().rfind("profile: ", 0) == 0);
  }
  CHECK(from_profile > 0);
  // The projections were measured per provider too, and plan's auto follows
  // them for both phases of the compute mode measured (f32).
  REQUIRE(j["projections"].is_array());
  if (!g3::onednn_unavailable_reason(g3::DType::F32).empty()) {
    // One provider is no comparison: no entries, the default rule stays.
    std::printf("skipped: tune's projection entries (%s)\n", g3::onednn_unavailable_reason(g3::DType::F32).c_str());
    CHECK(j["projections"].empty());
    return;
  }
  CHECK(j["projections"].size() == 2);
  REQUIRE(p.projections.size() == 2);
  REQUIRE(plan["projections"].size() == 1);
  for (const char* phase : {"prefill", "decode"}) {
    const g3::ProjectionEntry* e =
        p.find_projection(std::string(phase) == "prefill" ? g3::Phase::Prefill : g3::Phase::Decode, g3::DType::F32);
    REQUIRE(e);
    CHECK(plan["projections"][0][phase]["provider"] == e->best);
    CHECK(plan["projections"][0][phase]["source"].get<std::string>().rfind("profile: ", 0) == 0);
  }
}

TEST_CASE("tune keeps, per phase and compute mode, the projection provider fastest relative to each model",
          "[tune]") {
  auto prow = [](const std::string& proj, const std::string& model, int64_t tokens, const std::string& compute,
                 double ms) {
    g3::bench::Row r;
    r.backend = r.route = "highway";
    r.phase = "projections";
    r.proj = r.proj_route = proj;
    r.model = model;
    r.new_tokens = tokens;
    r.compute = compute;
    r.ms_median = ms;
    return r;
  };
  // Prefill f32: onednn wins 1b by a lot and loses 4b by a little, so it has
  // the lower score. Decode f32: highway everywhere. bf16 prefill: onednn
  // measured on one model only. An auto row and an attention row are never
  // candidates.
  std::vector<g3::bench::Row> rows = {
      prow("highway", "1b", 512, "f32", 10), prow("onednn", "1b", 512, "f32", 5),
      prow("highway", "4b", 512, "f32", 20), prow("onednn", "4b", 512, "f32", 21),
      prow("highway", "1b", 1, "f32", 1),    prow("onednn", "1b", 1, "f32", 3),
      prow("highway", "1b", 512, "bf16", 9), prow("onednn", "4b", 512, "bf16", 2),
      prow("highway", "4b", 512, "bf16", 9), prow("auto", "1b", 1, "f32", 0.1)};
  rows.push_back(row("xbyak", "decode", 4096, 0.01));
  const auto entries = g3::bench::projection_entries_from_rows(rows);
  // bf16 prefill: onednn measured one of the two models, so highway is the
  // only candidate, and one candidate is no comparison: no entry.
  REQUIRE(entries.size() == 2);
  for (const g3::ProjectionEntry& e : entries) {
    INFO(g3::to_string(e.phase) << " " << g3::to_string(e.compute));
    if (e.phase == g3::Phase::Prefill && e.compute == g3::DType::F32) {
      CHECK(e.best == "onednn");
      CHECK(e.rel.at("onednn") == Approx(1.0 + 21.0 / 20.0));
      CHECK(e.rel.at("highway") == Approx(2.0 + 1.0));
      CHECK(e.ms.at("highway") == Approx(30.0));
    } else {
      CHECK(e.phase == g3::Phase::Decode);
      CHECK(e.compute == g3::DType::F32);
      CHECK(e.best == "highway");
      CHECK(e.margin() == Approx(2.0));
    }
  }
}

TEST_CASE("a profile's projection entry changes what plan's --proj auto runs, and names itself", "[tune][cli]") {
  g3test::TempDir dir;
  g3::Profile p = this_cpu_profile();
  g3::ProjectionEntry e;
  e.phase = g3::Phase::Decode;  // the default rule runs highway there
  e.compute = g3::DType::F32;
  e.best = "onednn";
  e.ms = {{"onednn", 1.0}, {"highway", 1.5}};
  e.rel = {{"onednn", 1.0}, {"highway", 1.5}};
  p.projections = {e};
  g3::save_profile(p, profile_in(dir));
  REQUIRE(g3::load_profile(profile_in(dir)).projections.size() == 1);
  const g3test::CmdResult r = g3test::run_g3attn({"plan", "--model", "1b", "--json"}, env_for(dir));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.empty());
  const json j = json::parse(r.out);
  REQUIRE(j["projections"].size() == 1);
  CHECK(j["projections"][0]["decode"]["provider"] == "onednn");
  CHECK(j["projections"][0]["decode"]["source"] == "profile: 1.50x the other provider");
  CHECK(j["projections"][0]["prefill"]["provider"] == "highway");
  CHECK(j["projections"][0]["prefill"]["source"] == "default rule");
  CHECK(j["layers"][0]["proj"]["decode"] == "onednn");
  // An explicit --proj wins over the profile; the reference keeps its GEMM.
  const json h = json::parse(g3test::run_g3attn({"plan", "--model", "1b", "--proj", "highway", "--json"}, env_for(dir)).out);
  CHECK(h["projections"][0]["decode"]["provider"] == "highway");
  CHECK(h["projections"][0]["decode"]["source"] == "--proj highway");
  const json ref =
      json::parse(g3test::run_g3attn({"plan", "--model", "1b", "--backend", "reference", "--json"}, env_for(dir)).out);
  CHECK(ref["projections"][0]["decode"]["provider"] == "highway");
  // A profile naming an unknown provider is refused like any corrupt one.
  std::string text = g3test::read_text(profile_in(dir));
  const size_t at = text.find("\"onednn\"", text.find("\"projections\""));
  REQUIRE(at != std::string::npos);
  text.replace(at, 8, "\"mkl\"");
  g3test::write_text(profile_in(dir), text);
  const g3test::CmdResult bad = g3test::run_g3attn({"plan", "--model", "1b", "--json"}, env_for(dir));
  REQUIRE(bad.exit_code == 0);
  CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
  CHECK(json::parse(bad.out)["projections"][0]["decode"]["source"] == "default rule");
}

TEST_CASE("decode prefetch settings: the candidates' names parse back, anything else is refused", "[tune]") {
  for (const g3::DecodePrefetch& c : g3::decode_prefetch_candidates())
    CHECK(g3::parse_decode_prefetch(c.str(), "x") == c);
  CHECK(g3::decode_prefetch_candidates().front() == g3::DecodePrefetch{});
  CHECK(g3::parse_decode_prefetch("l1:64", "x").level == G3_PREFETCH_L1);
  CHECK(g3::parse_decode_prefetch("l2:1048576", "x").bytes == 1 << 20);
  for (const char* bad : {"", "l2", "l2:", "l3:4096", "L2:4096", "l2:63", "l2:1048577", "l2:-64", "l2:4k",
                          "l2:99999999999", " l2:4096", "l1:4096 "}) {
    INFO(bad);
    CHECK_THROWS_AS(g3::parse_decode_prefetch(bad, "--x"), g3::InputError);
  }
}

TEST_CASE("a profile's decode prefetch is what the core calls carry, and plan names it", "[tune][cli]") {
  g3test::TempDir dir;
  const auto plan_prefetch = [&] {
    const g3test::CmdResult r = g3test::run_g3attn({"plan", "--model", "1b", "--backend", "highway", "--json"}, env_for(dir));
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    return std::make_pair(json::parse(r.out)["decode_prefetch"], r.err);
  };
  // No profile: the cores' default.
  auto [none, none_err] = plan_prefetch();
  CHECK(none["setting"] == "default");
  CHECK(none["source"] == "default");
  CHECK(none_err.empty());
  g3::Profile p = this_cpu_profile();
  g3::PrefetchEntry e;
  e.best = "l2:16384";
  e.ms = {{"default", 13.0}, {"l2:16384", 10.0}, {"l2:32768", 10.5}};
  e.rel = {{"default", 2.6}, {"l2:16384", 2.0}, {"l2:32768", 2.1}};
  p.prefetch = e;
  g3::save_profile(p, profile_in(dir));
  const g3::Profile back = g3::load_profile(profile_in(dir));
  REQUIRE(back.prefetch);
  CHECK(back.prefetch->best == "l2:16384");
  CHECK(back.prefetch->ms == e.ms);
  CHECK(back.prefetch->gain() == Approx(0.3));
  auto [set, set_err] = plan_prefetch();
  CHECK(set["setting"] == "l2:16384");
  CHECK(set["source"] == "profile: 1.30x the default");
  CHECK(set_err.empty());
  // A setting that is no prefetch, or a time that is no time, makes the
  // profile corrupt: one warning, and the default.
  std::string text = g3test::read_text(profile_in(dir));
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"best\": \"l2:16384\"", "\"best\": \"l3:16384\""},
           {"\"l2:32768\": 10.5", "\"l2:32768\": -1"}}) {
    std::string edited = text;
    const size_t at = edited.find(from, edited.find("\"decode_prefetch\""));
    REQUIRE(at != std::string::npos);
    edited.replace(at, from.size(), to);
    g3test::write_text(profile_in(dir), edited);
    auto [bad, bad_err] = plan_prefetch();
    INFO(to);
    CHECK(bad["setting"] == "default");
    CHECK(std::count(bad_err.begin(), bad_err.end(), '\n') == 1);
    CHECK(bad_err.find("decode_prefetch") != std::string::npos);
  }
}

TEST_CASE("plan --proj: the help names it with its default, and a bad value is one stderr line and exit 2", "[tune][cli]") {
  const g3test::CmdResult h = g3test::run_g3attn({"plan", "--help"});
  REQUIRE(h.exit_code == 0);
  CHECK(h.out.find("--proj") != std::string::npos);
  CHECK(h.out.find("default auto") != std::string::npos);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"plan", "--model", "1b", "--proj", "mkl"},
        std::vector<std::string>{"plan", "--model", "1b", "--proj", "onednn", "--backend", "reference"}}) {
    const g3test::CmdResult r = g3test::run_g3attn(args);
    INFO(r.err);
    CHECK(r.exit_code == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find("--proj") != std::string::npos);
    CHECK(r.out.empty());
  }
}

TEST_CASE("a corrupt, foreign or stale profile gives one warning and the static rule", "[tune][cli]") {
  g3test::TempDir dir;
  const std::string path = profile_in(dir);
  g3::Profile good = this_cpu_profile();
  g3::ProfileEntry e;
  e.key = "dh256_g4_local512_b10000_s1_a0.0625_kvf32_wbf16";
  e.isa = "scalar";
  e.best = "reference";  // never the static rule's choice, so its effect shows
  e.ms = {{"reference", 1.0}};
  e.rel = {{"reference", 1.0}};
  good.entries = {e};

  SECTION("a valid profile is followed") {
    g3::save_profile(good, path);
    const g3test::CmdResult r =
        g3test::run_g3attn({"plan", "--model", "1b", "--isa", "scalar", "--json"}, env_for(dir));
    REQUIRE(r.exit_code == 0);
    CHECK(r.err.empty());
    CHECK(json::parse(r.out)["layers"][0]["backend"] == "reference");
  }
  struct Bad {
    const char* what;
    std::string text;
  };
  g3::Profile foreign = good, stale = good;
  foreign.cpu = "AuthenticAMD family 25 model 17 stepping 1 (AMD EPYC); avx2";
  stale.version = "0.0.1";
  for (const auto& [what, edit] : std::vector<std::pair<std::string, g3::Profile>>{{"foreign", foreign},
                                                                                      {"stale", stale}}) {
    SECTION(what) {
      g3::save_profile(edit, path);
      const g3test::CmdResult r =
          g3test::run_g3attn({"plan", "--model", "1b", "--isa", "scalar", "--json"}, env_for(dir));
      REQUIRE(r.exit_code == 0);
      CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
      CHECK(r.err.find("warning") != std::string::npos);
      const json j = json::parse(r.out);
      CHECK(j["layers"][0]["backend"] == "highway");
      CHECK(j["layers"][0]["source"] == "static rule");
    }
  }
  SECTION("corrupt") {
    for (const std::string& text : {std::string("{not json"), std::string("{\"format\": 1}"),
                                   std::string("{\"format\": 7, \"entries\": []}")}) {
      g3test::write_text(path, text);
      const g3test::CmdResult r =
          g3test::run_g3attn({"plan", "--model", "1b", "--isa", "scalar", "--json"}, env_for(dir));
      INFO(text);
      REQUIRE(r.exit_code == 0);
      CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
      CHECK(json::parse(r.out)["layers"][0]["source"] == "static rule");
    }
  }
  SECTION("a directory where the profile goes") {
    std::filesystem::create_directories(path);
    const g3test::CmdResult r =
        g3test::run_g3attn({"plan", "--model", "1b", "--isa", "scalar", "--json"}, env_for(dir));
    REQUIRE(r.exit_code == 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find("is a directory") != std::string::npos);
    CHECK(json::parse(r.out)["layers"][0]["source"] == "static rule");
  }
}

TEST_CASE("g3attn tune measures every ISA cap by default, the best first", "[tune][cli]") {
  // A budget spent by the best cap alone (the peaks take longer than a
  // second): the other caps are named in a note and keep the static rule.
  g3test::TempDir dir;
  const g3test::CmdResult t = g3test::run_g3attn(
      {"tune", "--model", "270m", "--kv-dtype", "f32", "--rounds", "1", "--budget", "1", "--json"},
      "G3ATTN_ISA= " + env_for(dir));
  INFO(t.err);
  REQUIRE(t.exit_code == 0);
  const json j = json::parse(t.out);
  for (const json& e : j["entries"]) CHECK(e["isa"] == g3::best_isa());
  std::string rest;
  for (const std::string& i : g3::runnable_isas())
    if (i != g3::best_isa()) rest += (rest.empty() ? "" : ",") + i;
  REQUIRE(!rest.empty());  // scalar at least
  bool named = false;
  for (const json& n : j["notes"])
    named |= n.get<std::string>().find("before ISA caps " + rest + ":") != std::string::npos;
  CHECK(named);
}

TEST_CASE("g3attn tune refuses a cache directory it cannot write before measuring", "[tune][cli][errors]") {
  // A file where the directory should be: one line naming the profile's
  // path and G3ATTN_CACHE_DIR, from the check made before any measurement
  // (a failed write at the end would say "cannot write").
  g3test::TempDir dir;
  g3test::write_text(dir.file("cache"), "");
  const g3test::CmdResult r = g3test::run_g3attn({"tune", "--model", "270m", "--isa", "best", "--rounds", "1"},
                                                 "G3ATTN_CACHE_DIR='" + dir.file("cache") + "'");
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find("g3attn tune: profile " + dir.file("cache") + "/tune-") == 0);
  CHECK(r.err.find("G3ATTN_CACHE_DIR") != std::string::npos);
  CHECK(r.out.empty());
}
