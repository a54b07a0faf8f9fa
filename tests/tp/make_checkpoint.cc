// Writes a Hugging Face style checkpoint for the tensor-parallel tests:
// DIR/config.json (a copy of CONFIG) and DIR/model.safetensors holding every
// layer's attention tensors drawn from SEED (projections bf16, norms f32).
// Seeded differently from the run's --seed, a run on it proves each rank
// read its rows from the file rather than drawing them.
//   tp_make_checkpoint CONFIG DIR SEED
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "generator/catalogue.h"
#include "runtime/io/layer_weights.h"

namespace {

struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

Entry matrix(const std::string& name, const g3::WeightMatrix& m) {
  Entry e{name, "BF16", {m.rows, m.cols}, {}};
  e.bytes.resize(m.bf16.size() * 2);
  std::memcpy(e.bytes.data(), m.bf16.data(), e.bytes.size());
  return e;
}

Entry vec(const std::string& name, const std::vector<float>& v) {
  Entry e{name, "F32", {int64_t(v.size())}, {}};
  e.bytes.resize(v.size() * 4);
  std::memcpy(e.bytes.data(), v.data(), e.bytes.size());
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: tp_make_checkpoint CONFIG DIR SEED\n";
    return 2;
  }
  const std::string config = argv[1], dir = argv[2];
  const uint64_t seed = std::stoull(argv[3]);
  const g3::ModelConfig cfg = g3::load_config_file(config);
  std::vector<Entry> entries;
  for (const g3::LayerSpec& s : g3::layer_specs(cfg)) {
    // bf16 draws, so the file holds exactly what the layers are made of.
    const g3::LayerWeights w = g3::random_layer_weights(s, seed, g3::DType::BF16);
    const std::string p = "model.layers." + std::to_string(s.index) + ".";
    entries.push_back(matrix(p + "self_attn.q_proj.weight", w.q_proj));
    entries.push_back(matrix(p + "self_attn.k_proj.weight", w.k_proj));
    entries.push_back(matrix(p + "self_attn.v_proj.weight", w.v_proj));
    entries.push_back(matrix(p + "self_attn.o_proj.weight", w.o_proj));
    entries.push_back(vec(p + "self_attn.q_norm.weight", w.q_norm));
    entries.push_back(vec(p + "self_attn.k_norm.weight", w.k_norm));
    entries.push_back(vec(p + "input_layernorm.weight", w.input_norm));
    entries.push_back(vec(p + "post_attention_layernorm.weight", w.post_norm));
  }
  // The format: an 8-byte little-endian header length, the JSON header
  // (padded with spaces to a multiple of 8 so the data stays aligned), then
  // every tensor's bytes at its data_offsets.
  nlohmann::json header = nlohmann::json::object();
  uint64_t at = 0;
  for (const Entry& e : entries) {
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {at, at + e.bytes.size()}}};
    at += e.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(config, dir + "/config.json", std::filesystem::copy_options::overwrite_existing);
  std::ofstream out(dir + "/model.safetensors", std::ios::binary | std::ios::trunc);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), std::streamsize(text.size()));
  for (const Entry& e : entries) out.write(reinterpret_cast<const char*>(e.bytes.data()), std::streamsize(e.bytes.size()));
  if (!out) {
    std::cerr << "tp_make_checkpoint: cannot write " << dir << "/model.safetensors\n";
    return 1;
  }
  return 0;
}
