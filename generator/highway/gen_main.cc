// g3attn-gen: writes the Highway attention sources of the given models (one
// .cc per distinct kernel key plus the registry .cc). CMake runs it at build
// time for the five built-in sizes; `g3attn generate` is the user-facing
// variant that also writes headers and a CMakeLists.txt.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "generator/errors.h"
#include "generator/highway/emitter.h"

namespace {

const char* kUsage =
    "Usage: g3attn-gen (--model NAME[,NAME...] | --config FILE)... --out DIR\n"
    "                  [--kv-dtype f32|bf16|all] [--slots N]\n"
    "  --model     built-in size(s): 270m 1b 4b 12b 27b (repeatable, or a comma list)\n"
    "  --config    an HF config.json (repeatable)\n"
    "  --out       directory receiving the sources (created if missing)\n"
    "  --kv-dtype  KV cache element types to generate for (default all)\n"
    "  --slots     N > 0: name sources hwy_attention_key_00.cc.. and pad to N files, for\n"
    "              build systems that must know output names in advance (default 0: one\n"
    "              file per key, named after it)\n";

// Writes through a temporary file and a rename, so a rerun never leaves a
// half-written source. An unchanged file is only touched: the build system
// reruns the generator when a template changes and must then see outputs
// newer than their inputs, or it would rerun it on every build.
void write_if_changed(const std::filesystem::path& p, const std::string& text) {
  {
    std::ifstream in(p, std::ios::binary);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      if (ss.str() == text) {
        in.close();
        std::filesystem::last_write_time(p, std::filesystem::file_time_type::clock::now());
        return;
      }
    }
  }
  std::filesystem::path tmp = p;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw g3::InputError("cannot write " + tmp.string());
  }
  std::filesystem::rename(tmp, p);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace g3;
  try {
    std::vector<ModelConfig> models;
    std::string out, kv = "all";
    int slots = 0;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw InputError(a + " needs a value");
        return argv[++i];
      };
      if (a == "--help" || a == "-h") {
        std::cout << kUsage;
        return 0;
      } else if (a == "--model") {
        std::stringstream ss(value());
        std::string name;
        while (std::getline(ss, name, ','))
          if (!name.empty()) models.push_back(builtin_model(name));
      } else if (a == "--config") {
        models.push_back(load_config_file(value()));
      } else if (a == "--out") {
        out = value();
      } else if (a == "--kv-dtype") {
        kv = value();
      } else if (a == "--slots") {
        std::string v = value();
        slots = std::atoi(v.c_str());
        if (slots < 0 || slots > 1000 || std::to_string(slots) != v)
          throw InputError("--slots: '" + v + "' is not an integer in [0, 1000]");
      } else {
        throw InputError("unknown argument '" + a + "' (see --help)");
      }
    }
    if (models.empty()) throw InputError("--model or --config is required (see --help)");
    if (out.empty()) throw InputError("--out DIR is required");
    std::vector<DType> dtypes;
    if (kv == "all") dtypes = {DType::F32, DType::BF16};
    else dtypes = {parse_dtype(kv, "--kv-dtype")};
    std::vector<KernelKey> keys = hwygen::attention_keys(models, dtypes);
    std::filesystem::create_directories(out);
    for (const auto& f : hwygen::key_sources(keys, slots)) write_if_changed(std::filesystem::path(out) / f.name, f.text);
    auto reg = hwygen::registry_source(keys);
    write_if_changed(std::filesystem::path(out) / reg.name, reg.text);
    std::printf("g3attn-gen: %zu kernel keys -> %s\n", keys.size(), out.c_str());
    return 0;
  } catch (const InputError& e) {
    std::fprintf(stderr, "g3attn-gen: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "g3attn-gen: internal error: %s\n", e.what());
    return 1;
  }
}
