// Checkpoints for the model stack: a generated multi-file (sharded)
// checkpoint directory loads the same tensors as the single-file one and runs
// to the same bits; a bad index (missing shard, a path outside the directory,
// malformed JSON) is an InputError with one line, exit code 2 from the CLI.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "generator/errors.h"
#include "runtime/exec/model.h"
#include "runtime/io/checkpoint.h"
#include "tests/support/test_support.h"

using namespace g3;
namespace fs = std::filesystem;

namespace {

const char* kConfig = R"({
  "model": "tiny-ckpt", "model_type": "gemma3_text",
  "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 4,
  "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
  "rope_scaling": {"rope_type": "linear", "factor": 8.0},
  "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 4096
})";

struct Tensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

Tensor matrix(const std::string& name, const WeightMatrix& m) {
  Tensor t{name, m.dtype == DType::BF16 ? "BF16" : "F32", {m.rows, m.cols}, {}};
  if (m.dtype == DType::BF16) {
    t.bytes.resize(m.bf16.size() * 2);
    std::memcpy(t.bytes.data(), m.bf16.data(), t.bytes.size());
  } else {
    t.bytes.resize(m.f32.size() * 4);
    std::memcpy(t.bytes.data(), m.f32.data(), t.bytes.size());
  }
  return t;
}

Tensor vec(const std::string& name, const std::vector<float>& v) {
  Tensor t{name, "F32", {int64_t(v.size())}, std::vector<uint8_t>(v.size() * 4)};
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

// The safetensors format written by hand: 8-byte little-endian header
// length, the JSON header, then the data, offsets relative to the data.
void write_safetensors(const std::string& path, const std::vector<Tensor>& ts) {
  nlohmann::json h = nlohmann::json::object();
  size_t off = 0;
  for (const auto& t : ts) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  h["__metadata__"] = {{"format", "pt"}};
  std::string hs = h.dump();
  while (hs.size() % 8) hs += ' ';
  std::vector<uint8_t> data;
  for (const auto& t : ts) data.insert(data.end(), t.bytes.begin(), t.bytes.end());
  g3test::write_bytes(path, g3test::safetensors_bytes(hs, data));
}

std::vector<Tensor> layer_tensors(const ModelConfig& cfg, int layer, uint64_t seed) {
  LayerSpec s = layer_spec(cfg, layer);
  LayerWeights w = random_layer_weights(s, seed, DType::BF16);
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  return {matrix(p + "self_attn.q_proj.weight", w.q_proj),
          matrix(p + "self_attn.k_proj.weight", w.k_proj),
          matrix(p + "self_attn.v_proj.weight", w.v_proj),
          matrix(p + "self_attn.o_proj.weight", w.o_proj),
          vec(p + "self_attn.q_norm.weight", w.q_norm),
          vec(p + "self_attn.k_norm.weight", w.k_norm),
          vec(p + "input_layernorm.weight", w.input_norm),
          vec(p + "post_attention_layernorm.weight", w.post_norm),
          // Not an attention tensor: must be ignored.
          vec(p + "pre_feedforward_layernorm.weight", std::vector<float>(64, 0.5f))};
}

// Writes <dir>/single (config.json + model.safetensors) and <dir>/sharded
// (config.json + two shards + model.safetensors.index.json).
void write_checkpoints(const std::string& dir, uint64_t seed) {
  ModelConfig cfg = parse_config_json(kConfig, "config.json");
  auto l0 = layer_tensors(cfg, 0, seed), l1 = layer_tensors(cfg, 1, seed);
  fs::create_directories(dir + "/single");
  fs::create_directories(dir + "/sharded");
  g3test::write_text(dir + "/single/config.json", kConfig);
  g3test::write_text(dir + "/sharded/config.json", kConfig);
  std::vector<Tensor> all = l0;
  all.insert(all.end(), l1.begin(), l1.end());
  all.push_back(vec("model.embed_tokens.weight", std::vector<float>(128, 1.f)));
  write_safetensors(dir + "/single/model.safetensors", all);
  // Shards split a layer across files, as real checkpoints do.
  std::vector<Tensor> a(l0.begin(), l0.end()), b(l1.begin(), l1.end());
  b.push_back(a.back());
  a.pop_back();
  a.push_back(b.front());
  b.erase(b.begin());
  write_safetensors(dir + "/sharded/model-00001-of-00002.safetensors", a);
  write_safetensors(dir + "/sharded/model-00002-of-00002.safetensors", b);
  nlohmann::json idx;
  idx["metadata"] = {{"total_size", 0}};
  for (const auto& t : a) idx["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const auto& t : b) idx["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  g3test::write_text(dir + "/sharded/model.safetensors.index.json", idx.dump(1));
}

bool same(const WeightMatrix& a, const WeightMatrix& b) {
  return a.dtype == b.dtype && a.rows == b.rows && a.cols == b.cols && a.bf16 == b.bf16 && a.f32 == b.f32;
}

bool same(const LayerWeights& a, const LayerWeights& b) {
  return same(a.q_proj, b.q_proj) && same(a.k_proj, b.k_proj) && same(a.v_proj, b.v_proj) &&
         same(a.o_proj, b.o_proj) && a.q_norm == b.q_norm && a.k_norm == b.k_norm && a.input_norm == b.input_norm &&
         a.post_norm == b.post_norm;
}

void write_index(const std::string& dir, const nlohmann::json& weight_map) {
  nlohmann::json j;
  j["weight_map"] = weight_map;
  g3test::write_text(dir + "/model.safetensors.index.json", j.dump());
}

}  // namespace

TEST_CASE("a sharded checkpoint directory loads the same tensors as the single file", "[checkpoint]") {
  g3test::TempDir tmp;
  write_checkpoints(tmp.path, 77);
  Checkpoint single = open_checkpoint(tmp.file("single"), nullptr);
  Checkpoint sharded = open_checkpoint(tmp.file("sharded"), nullptr);
  CHECK(single.config.name == "tiny-ckpt");
  CHECK(sharded.files.size() == 2);
  REQUIRE(single.config.num_layers == 2);
  CHECK(single.config.layer_types[1] == LayerKind::Global);
  for (const LayerSpec& s : layer_specs(single.config)) {
    LayerWeights a = single.layer(s), b = sharded.layer(s);
    CHECK(same(a, b));
    CHECK(same(a, random_layer_weights(s, 77, DType::BF16)));
    CHECK(a.q_proj.dtype == DType::BF16);  // bf16 stays bf16
  }
  // The index file and the .safetensors file can be named directly too.
  ModelConfig cfg = single.config;
  Checkpoint by_index = open_checkpoint(tmp.file("sharded/model.safetensors.index.json"), &cfg);
  Checkpoint by_file = open_checkpoint(tmp.file("single/model.safetensors"), &cfg);
  CHECK(same(by_index.layer(layer_spec(cfg, 1)), by_file.layer(layer_spec(cfg, 1))));

  // Both run to the same bits.
  auto run = [&](const Checkpoint& c) {
    ModelOptions o;
    o.backend = "auto";
    o.isa = "best";
    o.context = 20;
    o.chunk = 6;
    o.threads = 2;
    Model m(c.config, [&c](const LayerSpec& s) { return c.layer(s); }, o);
    std::vector<float> x(size_t(20 * 64)), y(x.size());
    std::mt19937 g(1);
    std::normal_distribution<float> nd;
    for (auto& v : x) v = nd(g);
    std::vector<int32_t> pos(20);
    for (int i = 0; i < 20; ++i) pos[size_t(i)] = i;
    m.forward(x.data(), pos.data(), nullptr, 20, y.data());
    return y;
  };
  CHECK(run(single) == run(sharded));
}

TEST_CASE("a bad checkpoint index is an InputError", "[checkpoint][errors]") {
  g3test::TempDir tmp;
  write_checkpoints(tmp.path, 5);
  const std::string d = tmp.file("sharded");
  const std::string s1 = "model-00001-of-00002.safetensors", s2 = "model-00002-of-00002.safetensors";
  nlohmann::json good = nlohmann::json::parse(g3test::read_text(d + "/model.safetensors.index.json"))["weight_map"];
  auto expect_error = [&](const nlohmann::json& wm, const std::string& needle) {
    write_index(d, wm);
    try {
      open_checkpoint(d, nullptr);
      FAIL("no InputError for " << wm.dump());
    } catch (const InputError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
      CHECK(std::string(e.what()).find('\n') == std::string::npos);
    }
  };
  nlohmann::json wm = good;
  wm["model.layers.0.self_attn.q_proj.weight"] = "model-00003-of-00002.safetensors";
  expect_error(wm, "does not exist");
  wm = good;
  g3test::write_bytes(tmp.file("outside.safetensors"), g3test::read_bytes(d + "/" + s1));
  wm["model.layers.0.self_attn.q_proj.weight"] = "../outside.safetensors";
  expect_error(wm, "leaves the checkpoint directory");
  wm["model.layers.0.self_attn.q_proj.weight"] = tmp.file("outside.safetensors");
  expect_error(wm, "absolute path");
  fs::create_symlink(tmp.file("outside.safetensors"), d + "/link.safetensors");
  wm["model.layers.0.self_attn.q_proj.weight"] = "link.safetensors";
  expect_error(wm, "outside");
  wm["model.layers.0.self_attn.q_proj.weight"] = 3;
  expect_error(wm, "not a file name string");
  expect_error(nlohmann::json::array(), "weight_map");
  expect_error(nlohmann::json::object(), "empty");
  g3test::write_text(d + "/model.safetensors.index.json", "{\"weight_map\": {");
  CHECK_THROWS_AS(open_checkpoint(d, nullptr), InputError);

  // The index names a shard that does not hold the tensor: found when loading.
  wm = good;
  wm["model.layers.0.self_attn.q_proj.weight"] = s2;
  write_index(d, wm);
  Checkpoint c = open_checkpoint(d, nullptr);
  CHECK_THROWS_AS(c.layer(layer_spec(c.config, 0)), InputError);

  // No weights at all, no config.
  CHECK_THROWS_AS(open_checkpoint(tmp.file("nothing"), nullptr), InputError);
  fs::create_directories(tmp.file("empty"));
  CHECK_THROWS_AS(open_checkpoint(tmp.file("empty"), nullptr), InputError);
}

TEST_CASE("g3attn run reads a checkpoint directory", "[checkpoint][cli]") {
  g3test::TempDir tmp;
  write_checkpoints(tmp.path, 9);
  auto a = g3test::run_g3attn({"run", "--weights", tmp.file("sharded"), "--prompt", "12", "--decode", "3", "--chunk",
                               "5", "--verify", "--json", tmp.file("a.json")});
  INFO(a.out << a.err);
  REQUIRE(a.exit_code == 0);
  auto b = g3test::run_g3attn({"run", "--config", tmp.file("single/config.json"), "--weights",
                               tmp.file("single/model.safetensors"), "--prompt", "12", "--decode", "3", "--chunk",
                               "5", "--json", tmp.file("b.json")});
  REQUIRE(b.exit_code == 0);
  auto ja = nlohmann::json::parse(g3test::read_text(tmp.file("a.json")));
  CHECK(ja["model"]["name"] == "tiny-ckpt");
  CHECK(ja["verify"]["max_abs_diff"].get<double>() <= 1e-4);
  write_index(tmp.file("sharded"), {{"model.layers.0.self_attn.q_proj.weight", "../../etc/passwd"}});
  auto c = g3test::run_g3attn({"run", "--weights", tmp.file("sharded"), "--prompt", "4", "--decode", "0"});
  CHECK(c.exit_code == 2);
  CHECK(c.err.find("leaves the checkpoint directory") != std::string::npos);
}
