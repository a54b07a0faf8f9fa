// `g3attn apply` end to end: a golden case through the command, and every
// kind of bad input it must refuse: exit code 2, one line on
// stderr naming the file, and no output file left behind.
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>

#include "runtime/io/npy.h"
#include "tests/support/test_support.h"

using nlohmann::json;

namespace {

const char* kCase = "tiny_global_L5_T12_B2_rightpad";

// A file of kCase; a missing one fails the test with its path (golden_file).
std::string golden(const std::string& f) { return g3test::golden_file(kCase, f); }

// The arguments of a valid apply of kCase, with files overridable.
struct ApplyArgs {
  std::string config = golden("config.json"), weights = golden("weights.safetensors"), input = golden("x.npy"),
              positions = golden("positions.npy"), mask = golden("attention_mask.npy");
  std::vector<std::string> extra;
  std::vector<std::string> build(const std::string& out_dir) const {
    std::vector<std::string> a = {"apply",       "--config", config, "--weights", weights, "--input", input,
                                  "--positions", positions,  "--out", out_dir + "/block.npy", "--attn-out",
                                  out_dir + "/attn.npy"};
    if (!mask.empty()) {
      a.push_back("--attention-mask");
      a.push_back(mask);
    }
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

// Runs apply expecting a clean refusal mentioning `what`.
void expect_refusal(const ApplyArgs& args, const std::string& what) {
  g3test::TempDir out;
  auto r = g3test::run_g3attn(args.build(out.path));
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 2);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find(what) != std::string::npos);
  CHECK(g3test::count_entries(out.path) == 0);  // no output, no temp file
}

struct Weights {
  json header;
  std::vector<uint8_t> data;
};
Weights golden_weights() {
  auto bytes = g3test::read_bytes(golden("weights.safetensors"));
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  Weights w;
  w.header = json::parse(std::string(bytes.begin() + 8, bytes.begin() + 8 + long(n)));
  w.data.assign(bytes.begin() + 8 + long(n), bytes.end());
  return w;
}

}  // namespace

TEST_CASE("apply writes outputs that match the golden case", "[apply][cli]") {
  g3test::TempDir out;
  ApplyArgs a;
  a.extra = {"--backend", "reference"};
  auto r = g3test::run_g3attn(a.build(out.path));
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto got = g3::read_npy_f32(out.file("block.npy"));
  auto want = g3::read_npy_f32(golden("block_out.npy"));
  auto mask = g3::read_npy_i32(golden("attention_mask.npy"));
  REQUIRE(got.shape == want.shape);
  const int64_t D = got.shape[2];
  std::vector<bool> ok(mask.i32.begin(), mask.i32.end());
  int64_t bad = 0;
  g3test::max_abs_diff(got.f32.data(), want.f32.data(), got.shape[0] * got.shape[1], D, ok, 5e-4, 1e-4, &bad);
  CHECK(bad == 0);
  CHECK(g3test::count_entries(out.path) == 2);
}

TEST_CASE("apply: --layer is required without layer_index; out of range is refused", "[apply][cli][errors]") {
  g3test::TempDir t;
  json cfg = json::parse(g3test::read_text(golden("config.json")));
  cfg.erase("layer_index");
  g3test::write_text(t.file("config.json"), cfg.dump());
  ApplyArgs a;
  a.config = t.file("config.json");
  expect_refusal(a, "--layer is required");
  a.extra = {"--layer", "9"};
  expect_refusal(a, "--layer 9");
  a.extra = {"--layer", "4"};  // exists, but the weights hold layer 5 only
  expect_refusal(a, "no tensors for layer 4");
}

TEST_CASE("apply: bad safetensors files", "[apply][cli][errors]") {
  g3test::TempDir t;
  ApplyArgs a;
  a.weights = t.file("w.safetensors");
  auto full = g3test::read_bytes(golden("weights.safetensors"));

  SECTION("truncated") {
    g3test::write_bytes(a.weights, std::vector<uint8_t>(full.begin(), full.end() - 100));
    expect_refusal(a, "w.safetensors");
  }
  SECTION("header length beyond the file") {
    auto b = full;
    uint64_t n = b.size() * 2;
    std::memcpy(b.data(), &n, 8);
    g3test::write_bytes(a.weights, b);
    expect_refusal(a, "w.safetensors");
  }
  // kCase's weights with their header edited must be refused, naming `what`.
  auto expect_header_refused = [&](const std::function<void(json&)>& edit, const std::string& what) {
    auto w = golden_weights();
    edit(w.header);
    g3test::write_bytes(a.weights, g3test::safetensors_bytes(w.header.dump(), w.data));
    expect_refusal(a, what);
  };
  const std::string L5 = "model.layers.5.self_attn.";
  SECTION("offsets out of range") {
    expect_header_refused([&](json& h) { h[L5 + "v_proj.weight"]["data_offsets"] = {20800, 9999999}; },
                          "w.safetensors");
  }
  SECTION("overlapping offsets") {
    expect_header_refused([&](json& h) { h[L5 + "k_norm.weight"]["data_offsets"] = {128, 160}; }, "w.safetensors");
  }
  SECTION("unsupported dtype") {
    expect_header_refused([&](json& h) { h[L5 + "q_norm.weight"]["dtype"] = "I16"; }, "I16");
  }
  SECTION("missing tensor") {
    // Drop o_proj by renaming it: offsets stay valid, the name is gone.
    expect_header_refused(
        [&](json& h) {
          h[L5 + "o_proj.other"] = h[L5 + "o_proj.weight"];
          h.erase(L5 + "o_proj.weight");
        },
        "missing tensor model.layers.5.self_attn.o_proj.weight");
  }
  SECTION("tensor shape not matching the config") {
    expect_header_refused([&](json& h) { h[L5 + "q_proj.weight"]["shape"] = {32, 128}; },
                          "q_proj.weight has shape [32,128]");
  }
  SECTION("not a file at all") {
    a.weights = t.file("missing.safetensors");
    expect_refusal(a, "missing.safetensors");
  }
}

TEST_CASE("apply: bad .npy inputs", "[apply][cli][errors]") {
  g3test::TempDir t;
  ApplyArgs a;
  auto x = g3::read_npy_f32(golden("x.npy"));
  auto pos = g3::read_npy_i32(golden("positions.npy"));
  auto mask = g3::read_npy_i32(golden("attention_mask.npy"));

  SECTION("input of the wrong dtype") {
    a.input = golden("positions.npy");
    expect_refusal(a, "positions.npy");
  }
  SECTION("input in Fortran order") {
    auto b = g3::npy_bytes_f32(x.f32.data(), x.shape);
    std::string s(b.begin(), b.end());
    s.replace(s.find("False"), 5, "True ");
    g3test::write_text(t.file("x.npy"), s);
    a.input = t.file("x.npy");
    expect_refusal(a, "x.npy");
  }
  SECTION("input of the wrong shape") {
    g3::write_npy_f32(t.file("x.npy"), x.f32.data(), {2, 12, 32, 2});
    a.input = t.file("x.npy");
    expect_refusal(a, "x.npy: shape [2,12,32,2]");
  }
  SECTION("input whose width is not hidden_size") {
    g3::write_npy_f32(t.file("x.npy"), x.f32.data(), {2, 24, 32});
    a.input = t.file("x.npy");
    expect_refusal(a, "hidden_size=64");
  }
  SECTION("not a .npy file") {
    g3test::write_text(t.file("x.npy"), "hello, this is text\n");
    a.input = t.file("x.npy");
    expect_refusal(a, "x.npy");
  }
  SECTION("positions shape not matching the input") {
    g3test::write_bytes(t.file("p.npy"), g3::npy_bytes_i32(pos.i32.data(), {2, 6, 2}));
    a.positions = t.file("p.npy");
    expect_refusal(a, "does not match");
  }
  SECTION("negative position on a real token") {
    auto p = pos.i32;
    p[3] = -1;  // row 0 is all real
    g3test::write_bytes(t.file("p.npy"), g3::npy_bytes_i32(p.data(), pos.shape));
    a.positions = t.file("p.npy");
    expect_refusal(a, "negative position");
  }
  SECTION("mask values other than 0/1") {
    auto m = mask.i32;
    m[0] = 2;
    g3test::write_bytes(t.file("m.npy"), g3::npy_bytes_i32(m.data(), mask.shape));
    a.mask = t.file("m.npy");
    expect_refusal(a, "not 0 or 1");
  }
}

TEST_CASE("apply: positions at padded slots are never checked", "[apply][cli]") {
  g3test::TempDir t, out;
  ApplyArgs a;
  auto pos = g3::read_npy_i32(golden("positions.npy"));
  auto mask = g3::read_npy_i32(golden("attention_mask.npy"));
  auto p = pos.i32;
  for (size_t i = 0; i < p.size(); ++i)
    if (!mask.i32[i]) p[i] = -12345;
  g3test::write_bytes(t.file("p.npy"), g3::npy_bytes_i32(p.data(), pos.shape));
  a.positions = t.file("p.npy");
  auto r = g3test::run_g3attn(a.build(out.path));
  INFO(r.err);
  CHECK(r.exit_code == 0);
}

TEST_CASE("apply: bad configs", "[apply][cli][errors]") {
  g3test::TempDir t;
  ApplyArgs a;
  a.config = t.file("config.json");
  json base = json::parse(g3test::read_text(golden("config.json")));
  auto with = [&](const char* k, json v) {
    json j = base;
    j[k] = v;
    g3test::write_text(a.config, j.dump());
  };
  SECTION("odd head_dim") {
    with("head_dim", 15);
    expect_refusal(a, "even");
  }
  SECTION("N not a multiple of Nkv") {
    with("num_key_value_heads", 3);
    expect_refusal(a, "not a multiple");
  }
  SECTION("zero window") {
    with("sliding_window", 0);
    expect_refusal(a, "sliding_window");
  }
  SECTION("absurd dimensions") {
    with("hidden_size", 1 << 30);
    expect_refusal(a, "hidden_size");
  }
  SECTION("negative layers") {
    with("num_hidden_layers", -6);
    expect_refusal(a, "num_hidden_layers");
  }
  SECTION("not JSON") {
    g3test::write_text(a.config, "{\"hidden_size\": 64,");
    expect_refusal(a, "not valid JSON");
  }
  SECTION("lacks a field") {
    json j = base;
    j.erase("num_attention_heads");
    g3test::write_text(a.config, j.dump());
    expect_refusal(a, "num_attention_heads is missing");
  }
  SECTION("values that contradict the weights") {
    with("num_attention_heads", 2);
    expect_refusal(a, "q_proj.weight has shape");
  }
}

TEST_CASE("apply: flags", "[apply][cli][errors]") {
  ApplyArgs a;
  SECTION("unknown backend") {
    a.extra = {"--backend", "gpu"};
    expect_refusal(a, "unknown backend 'gpu'");
  }
  SECTION("unknown ISA") {
    a.extra = {"--isa", "neon"};
    expect_refusal(a, "unknown ISA 'neon'");
  }
  SECTION("missing required flag") {
    g3test::TempDir out;
    auto r = g3test::run_g3attn({"apply", "--config", a.config});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("is required") != std::string::npos);
  }
  SECTION("output directory that does not exist") {
    g3test::TempDir out;
    auto args = a.build(out.path + "/no/such/dir");
    auto r = g3test::run_g3attn(args);
    CHECK(r.exit_code == 2);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
}
