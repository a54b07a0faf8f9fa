// The model catalogue: built-in sizes (SPEC 3.1/3.2), HF config.json in its
// legacy, v5 and multimodal forms, and every out-of-range value rejected.
#include <catch2/catch.hpp>
#include <cmath>
#include <sys/stat.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "generator/catalogue.h"
#include "generator/errors.h"
#include "generator/kernel_key.h"
#include "generator/text_file.h"
#include "tests/support/test_support.h"

using g3::LayerKind;
using nlohmann::json;

namespace {

std::vector<int> global_indices(const g3::ModelConfig& m) {
  std::vector<int> g;
  for (const auto& l : g3::layer_specs(m))
    if (l.kind == LayerKind::Global) g.push_back(l.index);
  return g;
}

// A complete gemma3_text config in the legacy (4.50-4.57) style.
json legacy_1b() {
  return json{{"model_type", "gemma3_text"},
              {"hidden_size", 1152},
              {"num_hidden_layers", 26},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 1},
              {"head_dim", 256},
              {"query_pre_attn_scalar", 256},
              {"sliding_window", 512},
              {"sliding_window_pattern", 6},
              {"rope_theta", 1000000},
              {"rope_local_base_freq", 10000},
              {"rope_scaling", nullptr},
              {"rms_norm_eps", 1e-6},
              {"attn_logit_softcapping", nullptr}};
}

g3::ModelConfig parse(const json& j) { return g3::parse_config_json(j.dump(), "config.json"); }

}  // namespace

TEST_CASE("built-in sizes have SPEC 3.2's global layers", "[catalogue]") {
  CHECK(global_indices(g3::builtin_model("270m")) == std::vector<int>{5, 11, 17});
  CHECK(global_indices(g3::builtin_model("1b")) == std::vector<int>{5, 11, 17, 23});
  CHECK(global_indices(g3::builtin_model("4b")) == std::vector<int>{5, 11, 17, 23, 29});
  CHECK(global_indices(g3::builtin_model("12b")) == std::vector<int>{5, 11, 17, 23, 29, 35, 41, 47});
  CHECK(global_indices(g3::builtin_model("27b")) == std::vector<int>{5, 11, 17, 23, 29, 35, 41, 47, 53, 59});
  // The tails are local: the last layer is not necessarily global (watch-out 7).
  CHECK(g3::layer_spec(g3::builtin_model("1b"), 25).kind == LayerKind::Local);
  CHECK(g3::layer_spec(g3::builtin_model("27b"), 61).kind == LayerKind::Local);
}

TEST_CASE("built-in sizes: alpha, rope, window per layer kind", "[catalogue]") {
  struct Want {
    const char* name;
    int D, L, N, K, H, W;
    double global_scale;
    double alpha;
  };
  const Want wants[] = {{"270m", 640, 18, 4, 1, 256, 512, 1.0, 0.0625},
                        {"1b", 1152, 26, 4, 1, 256, 512, 1.0, 0.0625},
                        {"4b", 2560, 34, 8, 4, 256, 1024, 8.0, 0.0625},
                        {"12b", 3840, 48, 16, 8, 256, 1024, 8.0, 0.0625},
                        {"27b", 5376, 62, 32, 16, 128, 1024, 8.0, 1.0 / std::sqrt(168.0)}};
  for (const auto& w : wants) {
    INFO(w.name);
    auto m = g3::builtin_model(w.name);
    CHECK(m.hidden_size == w.D);
    CHECK(m.num_layers == w.L);
    auto local = g3::layer_spec(m, 0), global = g3::layer_spec(m, 5);
    CHECK(local.num_heads == w.N);
    CHECK(local.num_kv_heads == w.K);
    CHECK(local.head_dim == w.H);
    CHECK(local.window == w.W);
    CHECK(global.window == 0);
    CHECK(local.rope_base == 1e4);
    CHECK(local.rope_scale == 1.0);  // never scaled on local layers (watch-out 6)
    CHECK(global.rope_base == 1e6);
    CHECK(global.rope_scale == w.global_scale);
    CHECK(local.alpha == static_cast<float>(w.alpha));
    CHECK(global.alpha == static_cast<float>(w.alpha));
    CHECK(local.rms_eps == 1e-6f);
  }
  // 27B: 1/sqrt(168), not 1/sqrt(head_dim = 128) (watch-out 1).
  CHECK(g3::layer_spec(g3::builtin_model("27b"), 0).alpha != static_cast<float>(1.0 / std::sqrt(128.0)));
  CHECK_THROWS_AS(g3::builtin_model("2b"), g3::InputError);
}

TEST_CASE("a Gemma 3 model needs two attention keys per dtype", "[catalogue]") {
  for (const auto& n : g3::builtin_model_names()) {
    auto keys = g3::distinct_keys(g3::builtin_model(n), g3::DType::F32, g3::DType::BF16);
    CHECK(keys.size() == 2);
    CHECK(keys[0].window > 0);
    CHECK(keys[1].window == 0);
    CHECK(keys[0].str() != keys[1].str());
  }
  // 270M and 1B share keys; so do 4B and 12B.
  CHECK(g3::distinct_keys(g3::builtin_model("270m"), g3::DType::F32, g3::DType::BF16)[0].str() ==
        g3::distinct_keys(g3::builtin_model("1b"), g3::DType::F32, g3::DType::BF16)[0].str());
}

TEST_CASE("legacy HF config.json equals the built-in size", "[catalogue]") {
  auto m = parse(legacy_1b());
  auto b = g3::builtin_model("1b");
  for (int i = 0; i < b.num_layers; ++i) {
    auto x = g3::layer_spec(m, i), y = g3::layer_spec(b, i);
    CHECK(x.kind == y.kind);
    CHECK(x.window == y.window);
    CHECK(x.rope_base == y.rope_base);
    CHECK(x.rope_scale == y.rope_scale);
    CHECK(x.alpha == y.alpha);
  }
}

TEST_CASE("rope_scaling applies to global layers only", "[catalogue]") {
  json j = legacy_1b();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  auto m = parse(j);
  CHECK(g3::layer_spec(m, 5).rope_scale == 8.0);
  CHECK(g3::layer_spec(m, 0).rope_scale == 1.0);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};  // older key name
  CHECK(g3::layer_spec(parse(j), 11).rope_scale == 4.0);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  CHECK_THROWS_WITH(parse(j), Catch::Contains("yarn"));
}

TEST_CASE("v5 rope_parameters per layer type and layer_types", "[catalogue]") {
  json j = legacy_1b();
  j.erase("rope_theta");
  j.erase("rope_local_base_freq");
  j.erase("rope_scaling");
  j.erase("sliding_window_pattern");
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 500000.0}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 20000.0}}}};
  json types = json::array();
  for (int i = 0; i < 26; ++i) types.push_back(i % 4 == 3 ? "full_attention" : "sliding_attention");
  j["layer_types"] = types;
  auto m = parse(j);
  CHECK(g3::layer_spec(m, 3).kind == LayerKind::Global);
  CHECK(g3::layer_spec(m, 3).rope_base == 500000.0);
  CHECK(g3::layer_spec(m, 3).rope_scale == 8.0);
  CHECK(g3::layer_spec(m, 0).kind == LayerKind::Local);
  CHECK(g3::layer_spec(m, 0).rope_base == 20000.0);
  CHECK(g3::layer_spec(m, 0).rope_scale == 1.0);
  CHECK(g3::layer_spec(m, 5).kind == LayerKind::Local);  // layer_types wins over i % 6
}

TEST_CASE("sliding_window_pattern sets the global layers", "[catalogue]") {
  json j = legacy_1b();
  j["sliding_window_pattern"] = 4;
  CHECK(global_indices(parse(j)) == std::vector<int>{3, 7, 11, 15, 19, 23});
}

TEST_CASE("multimodal gemma3 config: nested text_config with HF defaults", "[catalogue]") {
  // The shape of the 4B hub config: fields equal to Gemma3TextConfig's
  // defaults are omitted.
  json j = {{"model_type", "gemma3"},
            {"architectures", {"Gemma3ForConditionalGeneration"}},
            {"text_config",
             {{"model_type", "gemma3_text"},
              {"hidden_size", 2560},
              {"intermediate_size", 10240},
              {"num_hidden_layers", 34},
              {"rope_scaling", {{"factor", 8.0}, {"rope_type", "linear"}}},
              {"sliding_window", 1024}}},
            {"vision_config", {{"hidden_size", 1152}}}};
  auto m = parse(j);
  auto b = g3::builtin_model("4b");
  CHECK(m.num_heads == b.num_heads);
  CHECK(m.num_kv_heads == b.num_kv_heads);
  CHECK(m.head_dim == b.head_dim);
  CHECK(global_indices(m) == global_indices(b));
  CHECK(g3::layer_spec(m, 5).rope_scale == 8.0);
  CHECK(g3::layer_spec(m, 0).alpha == 0.0625f);
  CHECK(!m.defaulted.empty());
}

TEST_CASE("golden configs parse with their layer_index", "[catalogue]") {
  for (const auto& c : g3test::golden_cases()) {
    auto m = g3::load_config_file(g3test::golden_file(c, "config.json"));
    REQUIRE(m.layer_index.has_value());
    auto l = g3::layer_spec(m, *m.layer_index);
    INFO(c);
    CHECK((c.find("global") != std::string::npos) == (l.kind == LayerKind::Global));
  }
  if (g3test::need_golden_case("27b_D512_local_L0_T48", "the 27B golden config's query scale 1/sqrt(168)")) {
    auto m27 = g3::load_config_file(g3test::golden_file("27b_D512_local_L0_T48", "config.json"));
    CHECK(g3::layer_spec(m27, 0).alpha == static_cast<float>(1.0 / std::sqrt(168.0)));
  }
}

TEST_CASE("bad config values are clear errors", "[catalogue][errors]") {
  auto fails_with = [](json j, const char* what) {
    INFO(j.dump());
    CHECK_THROWS_WITH(parse(j), Catch::Contains(what));
  };
  auto with = [](const char* k, json v) {
    json j = legacy_1b();
    j[k] = v;
    return j;
  };
  auto without = [](const char* k) {
    json j = legacy_1b();
    j.erase(k);
    return j;
  };
  CHECK_THROWS_WITH(g3::parse_config_json("{not json", "c.json"), Catch::Contains("c.json: not valid JSON"));
  CHECK_THROWS_WITH(g3::parse_config_json("[1,2]", "c.json"), Catch::Contains("JSON object"));
  fails_with(without("hidden_size"), "hidden_size is missing");
  fails_with(without("num_attention_heads"), "num_attention_heads is missing");
  fails_with(without("head_dim"), "head_dim is missing");
  fails_with(without("query_pre_attn_scalar"), "query_pre_attn_scalar is missing");
  fails_with(with("hidden_size", 0), "hidden_size");
  fails_with(with("hidden_size", -5), "hidden_size");
  fails_with(with("hidden_size", "big"), "must be an integer");
  fails_with(with("num_hidden_layers", 1000000000), "num_hidden_layers");
  fails_with(with("head_dim", 1 << 30), "head_dim");
  fails_with(with("head_dim", 255), "must be even");
  fails_with(with("num_key_value_heads", 3), "not a multiple");
  fails_with(with("num_key_value_heads", 0), "num_key_value_heads");
  fails_with(with("sliding_window", 0), "sliding_window");
  fails_with(with("sliding_window", -1), "sliding_window");
  fails_with(with("query_pre_attn_scalar", 0), "query_pre_attn_scalar");
  fails_with(with("rope_theta", -1), "rope_theta");
  fails_with(with("rms_norm_eps", 0), "rms_norm_eps");
  fails_with(with("rope_scaling", json{{"rope_type", "linear"}, {"factor", 0.5}}), "rope scaling");
  fails_with(with("model_type", "gemma2"), "not a Gemma 3 model");
  fails_with(with("attn_logit_softcapping", 50.0), "softcap");
  fails_with(with("layer_types", json::array({"sliding_attention"})), "layer_types");
  fails_with(with("hidden_size", 1e300), "integer");
  fails_with(with("hidden_size", 18446744073709551615ull), "out of range");
  CHECK_THROWS_AS(g3::load_config_file("/nonexistent/config.json"), g3::InputError);
}

TEST_CASE("config files are read whole only when they are small", "[catalogue][errors]") {
  g3test::TempDir t;
  auto fails_with = [](const std::string& path, const std::string& what) {
    try {
      g3::load_config_file(path);
      FAIL("accepted " << path);
    } catch (const g3::InputError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(path + ": " + what) == 0);
    }
  };
  fails_with(t.path, "is a directory");
  fails_with(t.file("missing.json"), "cannot open (No such file or directory)");
  // A device that never ends is refused at the bound, not read until memory
  // runs out.
  if (access("/dev/zero", R_OK) == 0) fails_with("/dev/zero", "is larger than 64 MiB");
  // A regular file over the bound is refused by its size; at the bound it is read.
  g3test::write_text(t.file("seventeen"), std::string(17, ' '));
  CHECK_THROWS_WITH(g3::read_text_file(t.file("seventeen"), 16), t.file("seventeen") + ": is larger than 16 bytes");
  CHECK(g3::read_text_file(t.file("seventeen"), 17).size() == 17);
  // A pipe has no size: it is read to its end (a shell's <(...) gives one).
  const std::string fifo = t.file("config.fifo");
  g3::ModelConfig m;
  REQUIRE(g3test::read_from_fifo(fifo, legacy_1b().dump(), 0, [&] { m = g3::load_config_file(fifo); }).empty());
  CHECK(m.num_layers == 26);
  CHECK(m.hidden_size == 1152);
}

TEST_CASE("g3attn plan prints the 1B plan and its JSON", "[catalogue][cli]") {
  auto r = g3test::run_g3attn({"plan", "--model", "1b"});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("global") != std::string::npos);
  g3test::TempDir t;
  auto rj = g3test::run_g3attn({"plan", "--model", "4b", "--json", t.file("plan.json")});
  REQUIRE(rj.exit_code == 0);
  json j = json::parse(g3test::read_text(t.file("plan.json")));
  CHECK(j["model"]["name"] == "4b");
  CHECK(j["model"]["hidden_size"] == 2560);
  CHECK(j["model"]["num_layers"] == 34);
  REQUIRE(j["layers"].size() == 34);
  const json& l5 = j["layers"][5];
  CHECK(l5["kind"] == "global");
  CHECK(l5["window"].is_null());
  CHECK(l5["rope_scale"] == 8.0);
  CHECK(j["layers"][0]["window"] == 1024);
  CHECK(j["layers"][0]["rope_scale"] == 1.0);
  for (const char* f : {"index", "kind", "window", "rope_base", "rope_scale", "alpha", "num_heads", "num_kv_heads",
                        "head_dim", "key", "backend", "isa"})
    CHECK(l5.contains(f));
  // --json alone prints to stdout.
  auto rs = g3test::run_g3attn({"plan", "--model", "27b", "--json"});
  REQUIRE(rs.exit_code == 0);
  CHECK(json::parse(rs.out)["layers"].size() == 62);
}

TEST_CASE("g3attn plan rejects bad input with one line and exit code 2", "[catalogue][cli][errors]") {
  for (auto args : std::vector<std::vector<std::string>>{{"plan", "--model", "3b"},
                                                         {"plan"},
                                                         {"plan", "--model", "1b", "--isa", "avx9"},
                                                         {"plan", "--model", "1b", "--backend", "cuda"},
                                                         {"plan", "--model", "1b", "--bogus"},
                                                         {"plan", "--config", "/nonexistent.json"},
                                                         {"plan", "--config", "/"}}) {
    auto r = g3test::run_g3attn(args);
    INFO(args.back() << ": " << r.err);
    CHECK(r.exit_code == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  auto r = g3test::run_g3attn({"plan", "--model", "1b"}, "G3ATTN_ISA=nope");
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("G3ATTN_ISA") != std::string::npos);
}

TEST_CASE("g3attn says when its output cannot be written", "[catalogue][cli][errors]") {
  // /dev/full takes no byte (ENOSPC): a table to stdout, and --json to it
  // (written in place: a device is not replaced, whoever runs the test).
  if (access("/dev/full", W_OK) != 0) return;
  const std::string bin = "'" + g3test::g3attn_bin() + "'";
  for (const std::string& cmd : {bin + " plan --model 1b >/dev/full", bin + " --help >/dev/full",
                                 bin + " plan --model 1b --json >/dev/full"}) {
    const g3test::CmdResult r = g3test::run_shell("( " + cmd + " )");
    INFO(cmd << " -> " << r.err);
    CHECK(r.exit_code == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK(r.err.find("cannot write standard output") != std::string::npos);
  }
  const g3test::CmdResult j = g3test::run_g3attn({"plan", "--model", "1b", "--json", "/dev/full"});
  CHECK(j.exit_code == 2);
  CHECK(j.err == "g3attn plan: cannot write /dev/full: No space left on device\n");
  struct stat st = {};
  REQUIRE(stat("/dev/full", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  // --json to a device that takes it: /dev/stdout is the document itself.
  const g3test::CmdResult d = g3test::run_g3attn({"plan", "--model", "1b", "--json", "/dev/stdout"});
  REQUIRE(d.exit_code == 0);
  CHECK(json::parse(d.out)["model"]["name"] == "1b");
}
