// g3attn generate: writes the specialised Highway attention sources of a
// model (one .cc per kernel key plus the registry), the headers they include,
// a CMakeLists.txt and a README into a directory, so another engine can build
// them with nothing but Highway.
#include <filesystem>
#include <iostream>

#include "generator/errors.h"
#include "generator/highway/emitter.h"
#include "generator/kernel_key.h"
#include "runtime/cli/args.h"
#include "runtime/cli/commands.h"
#include "runtime/io/npy.h"

namespace g3::cli {

static std::vector<Option> generate_options() {
  return {
      {"model", Arity::Value, "NAME", "built-in size(s): 270m|1b|4b|12b|27b, or a comma list"},
      {"config", Arity::Value, "FILE", "an HF config.json instead of --model"},
      {"out", Arity::Value, "DIR", "output directory, created if missing (required)"},
      {"kv-dtype", Arity::Value, "T", "KV cache element types to generate: f32|bf16|all (default all)"},
  };
}

int cmd_generate(int argc, char** argv, int first) {
  Args a("generate", generate_options(), argc, argv, first);
  if (a.help()) {
    std::cout << "Usage: g3attn generate --model NAME[,NAME...] | --config FILE --out DIR [--kv-dtype f32|bf16|all]\n"
                 "Writes one Highway source per distinct attention kernel key of the model(s), a\n"
                 "registry source (key -> per-ISA kernel table), the headers they include, a\n"
                 "CMakeLists.txt, a smoke test and a README into DIR. Build them with\n"
                 "  cmake -S DIR -B DIR/build && cmake --build DIR/build\n"
                 "(needs only CMake, a C++17 compiler and Google Highway). Existing files of\n"
                 "the same names are replaced; other files in DIR are left alone.\n\n"
              << a.usage();
    return 0;
  }
  if (a.has("model") && a.has("config")) throw InputError("give either --model or --config, not both");
  std::vector<ModelConfig> models;
  std::vector<std::string> names;
  if (a.has("config")) {
    models.push_back(load_config_file(a.str("config")));
  } else if (a.has("model")) {
    for (const auto& n : a.list("model", "")) models.push_back(builtin_model(n));
  } else {
    throw InputError("--model NAME or --config FILE is required (models: 270m, 1b, 4b, 12b, 27b)");
  }
  for (const auto& m : models) names.push_back(m.name);
  if (!a.has("out")) throw InputError("--out DIR is required");
  const std::string out = a.str("out");
  const std::string kv = a.str("kv-dtype", "all");
  std::vector<DType> dtypes;
  if (kv == "all") dtypes = {DType::F32, DType::BF16};
  else dtypes = {parse_dtype(kv, "--kv-dtype")};

  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec)) throw InputError("--out " + out + ": exists and is not a directory");
  fs::create_directories(out, ec);
  if (ec) throw InputError("--out " + out + ": cannot create the directory: " + ec.message());

  const std::vector<KernelKey> keys = hwygen::attention_keys(models, dtypes);
  std::vector<hwygen::SourceFile> files = hwygen::key_sources(keys, 0);
  files.push_back(hwygen::registry_source(keys));
  for (const auto& t : hwygen::embedded_templates()) files.push_back({t.first, t.second});
  files.push_back(hwygen::standalone_check());
  files.push_back(hwygen::standalone_cmakelists(keys));
  files.push_back(hwygen::standalone_readme(keys, names));
  // Each file is written atomically (temporary file, fsync, rename), so an
  // interrupted run never leaves a truncated source behind.
  for (const auto& f : files)
    write_file_atomic((fs::path(out) / f.name).string(), std::vector<uint8_t>(f.text.begin(), f.text.end()));
  std::cout << "wrote " << files.size() << " files (" << keys.size() << " kernel keys) to " << out << "\n";
  for (const auto& k : keys) std::cout << "  " << hwygen::attention_key(k) << "\n";
  std::cout << "build: cmake -S " << out << " -B " << out << "/build && cmake --build " << out << "/build\n";
  return 0;
}

}  // namespace g3::cli
