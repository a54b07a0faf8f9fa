#include "runtime/io/checkpoint.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "generator/errors.h"
#include "generator/text_file.h"

namespace g3 {

namespace fs = std::filesystem;

namespace {

// An index names tensors and a few shards; anything this large is not one.
constexpr uintmax_t kMaxIndexBytes = 64u << 20;

// Keeps names quoted from a file printable and on one line.
std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 120; ++i) {
    unsigned char u = static_cast<unsigned char>(s[i]);
    out += (u >= 0x20 && u < 0x7f) ? s[i] : '?';
  }
  if (s.size() > 120) out += "...";
  return out;
}

// True when `inner` is `outer` or below it, comparing whole components.
bool is_within(const fs::path& outer, const fs::path& inner) {
  auto o = outer.begin(), i = inner.begin();
  for (; o != outer.end(); ++o, ++i)
    if (i == inner.end() || *o != *i) return false;
  return true;
}

// Resolves one shard name of the index to a file inside `dir`.
fs::path shard_path(const fs::path& index, const fs::path& dir_canon, const std::string& name) {
  const std::string where = index.string() + ": shard \"" + printable(name) + "\"";
  if (name.empty() || name.find('\0') != std::string::npos) throw InputError(where + " is not a file name");
  fs::path rel(name);
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory())
    throw InputError(where + " is an absolute path; shards must be inside " + dir_canon.string());
  for (const auto& part : rel)
    if (part == "..") throw InputError(where + " leaves the checkpoint directory (\"..\")");
  fs::path p = dir_canon / rel;
  std::error_code ec;
  if (!fs::exists(p, ec)) throw InputError(where + " does not exist in " + dir_canon.string());
  fs::path canon = fs::canonical(p, ec);
  if (ec) throw InputError(where + ": " + ec.message());
  if (!is_within(dir_canon, canon))
    throw InputError(where + " resolves to " + canon.string() + ", outside " + dir_canon.string());
  if (!fs::is_regular_file(canon, ec)) throw InputError(where + " is not a regular file");
  return canon;
}

struct Sharded {
  std::map<std::string, std::shared_ptr<SafeTensorsFile>> by_shard;
  std::map<std::string, std::string> weight_map;
  std::string index;
};

}  // namespace

Checkpoint open_checkpoint(const std::string& weights, const ModelConfig* config) {
  std::error_code ec;
  fs::path w(weights);
  if (!fs::exists(w, ec)) throw InputError("--weights " + weights + ": no such file or directory");
  fs::path dir, index, single;
  if (fs::is_directory(w, ec)) {
    dir = w;
    if (fs::exists(w / "model.safetensors.index.json")) index = w / "model.safetensors.index.json";
    else if (fs::exists(w / "model.safetensors")) single = w / "model.safetensors";
    else
      throw InputError("--weights " + weights +
                       ": the directory holds neither model.safetensors.index.json nor model.safetensors");
  } else {
    dir = w.has_parent_path() ? w.parent_path() : fs::path(".");
    if (w.extension() == ".json") index = w;
    else single = w;
  }
  const fs::path dir_canon = fs::canonical(dir, ec);
  if (ec) throw InputError("--weights " + weights + ": " + ec.message());

  Checkpoint c;
  c.describe = weights;
  if (config) {
    c.config = *config;
  } else {
    fs::path cfg = dir / "config.json";
    if (!fs::exists(cfg, ec))
      throw InputError("--weights " + weights + ": no config.json beside the weights; give --config or --model");
    c.config = load_config_file(cfg.string());
  }

  if (!single.empty()) {
    auto f = SafeTensorsFile::open(single.string());
    c.files.push_back(f);
    c.source = TensorSource{[f](const std::string& n) -> const TensorView* { return f->has(n) ? &f->get(n) : nullptr; },
                            single.string()};
    return c;
  }

  auto sh = std::make_shared<Sharded>();
  sh->index = index.string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(index.string(), kMaxIndexBytes));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(index.string() + ": not valid JSON (" + printable(e.what()) + ")");
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw InputError(index.string() + ": expected a JSON object with a \"weight_map\" object");
  if (j["weight_map"].empty()) throw InputError(index.string() + ": \"weight_map\" is empty");
  for (const auto& [name, shard] : j["weight_map"].items()) {
    if (!shard.is_string())
      throw InputError(index.string() + ": weight_map entry \"" + printable(name) + "\" is not a file name string");
    const std::string s = shard.get<std::string>();
    if (!sh->by_shard.count(s)) {
      fs::path p = shard_path(index, dir_canon, s);
      sh->by_shard[s] = nullptr;  // opened below, after every name is validated
      (void)p;
    }
    sh->weight_map[name] = s;
  }
  for (auto& [s, f] : sh->by_shard) {
    f = SafeTensorsFile::open(shard_path(index, dir_canon, s).string());
    c.files.push_back(f);
  }
  c.source = TensorSource{[sh](const std::string& n) -> const TensorView* {
                            auto it = sh->weight_map.find(n);
                            if (it == sh->weight_map.end()) return nullptr;
                            const auto& f = sh->by_shard.at(it->second);
                            if (!f->has(n))
                              throw InputError(sh->index + ": weight_map puts " + printable(n) + " in " +
                                               printable(it->second) + ", which does not hold it");
                            return &f->get(n);
                          },
                          index.string()};
  return c;
}

}  // namespace g3
