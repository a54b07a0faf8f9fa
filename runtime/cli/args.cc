#include "runtime/cli/args.h"

#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <iostream>

#include "generator/errors.h"
#include "runtime/io/npy.h"

namespace g3::cli {

Args::Args(const std::string& command, const std::vector<Option>& options, int argc, char** argv, int first)
    : command_(command), options_(options) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    // Messages leave out the "g3attn <command>: " prefix: main() adds it to
    // every InputError, so the command is named once.
    if (a.rfind("--", 0) != 0)
      throw InputError("unexpected argument '" + a + "' (see g3attn " + command + " --help)");
    std::string name = a.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    const Option* opt = nullptr;
    for (const auto& o : options_)
      if (o.name == name) opt = &o;
    if (!opt)
      throw InputError("unknown option --" + name + " (see g3attn " + command + " --help)");
    if (values_.count(name)) throw InputError("--" + name + " given twice");
    if (opt->arity == Arity::Switch) {
      if (inline_value) throw InputError("--" + name + " takes no value");
    } else if (!inline_value) {
      bool next_is_value = i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0;
      if (next_is_value) value = argv[++i];
      else if (opt->arity == Arity::Value) throw InputError("--" + name + " needs a value (" + opt->meta + ")");
    }
    if (opt->arity == Arity::Value && value.empty()) throw InputError("--" + name + " needs a non-empty value");
    values_[name] = value;
  }
}

std::string Args::str(const std::string& name, const std::string& def) const {
  auto it = values_.find(name);
  return it == values_.end() ? def : it->second;
}

long long Args::integer(const std::string& name, long long def, long long lo, long long hi) const {
  auto it = values_.find(name);
  if (it == values_.end()) return def;
  const std::string& s = it->second;
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used, 10);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != s.size()) throw InputError("--" + name + ": '" + s + "' is not an integer");
  if (v < lo || v > hi)
    throw InputError("--" + name + ": " + s + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

std::vector<std::string> split_list(const std::string& s, const std::string& what) {
  if (s.empty()) throw InputError(what + ": empty list");
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t comma; (comma = s.find(',', start)) != std::string::npos; start = comma + 1)
    out.push_back(s.substr(start, comma - start));
  out.push_back(s.substr(start));
  for (const std::string& item : out)
    if (item.empty()) throw InputError(what + ": empty element in '" + s + "'");
  return out;
}

std::vector<std::string> Args::list(const std::string& name, const std::string& def) const {
  return split_list(str(name, def), "--" + name);
}

std::string Args::usage() const {
  std::string s = "Options of g3attn " + command_ + ":\n";
  for (const auto& o : options_) {
    std::string lhs = "  --" + o.name;
    if (o.arity == Arity::Value) lhs += " " + o.meta;
    if (o.arity == Arity::OptionalValue) lhs += " [" + o.meta + "]";
    if (lhs.size() < 28) lhs.resize(28, ' ');
    else lhs += "\n" + std::string(28, ' ');
    s += lhs + o.help + "\n";
  }
  s += "  --help                    this text\n";
  return s;
}

std::vector<Option> common_kernel_options() {
  return {
      {"backend", Arity::Value, "NAME",
       "reference|highway|llvm|xbyak|amx|auto (default auto: see `g3attn --help`)"},
      {"isa", Arity::Value, "NAME",
       "scalar|ssse3|sse4|avx2|avx3|avx3_dl|best; caps JIT code too (default $G3ATTN_ISA, else best)"},
      {"kv-dtype", Arity::Value, "T", "KV cache element type f32|bf16 (default f32)"},
      {"compute", Arity::Value, "MODE",
       "f32|bf16: bf16 rounds the inputs of every dot product to bf16 (default f32; see `g3attn --help`)"},
  };
}

void emit_json(const Args& a, const std::string& text) {
  std::string file = a.str("json");
  if (file.empty()) {
    std::cout << text << "\n";
    return;
  }
  std::vector<uint8_t> bytes(text.begin(), text.end());
  bytes.push_back('\n');
  write_file_atomic(file, bytes);
}

void check_output_path(const std::string& file, const std::string& flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(file);
  if (fs::is_directory(p, ec)) throw InputError(flag + " " + file + ": is a directory");
  // A device or FIFO (/dev/stdout) is written in place (write_file_atomic):
  // it must be writable itself. A file is replaced through a temporary
  // beside it (beside a symlink's target), so its directory must be.
  const fs::file_status st = fs::status(p, ec);
  if (!ec && fs::exists(st) && !fs::is_regular_file(st)) {
    if (access(file.c_str(), W_OK) != 0) throw InputError(flag + " " + file + ": is not writable");
    return;
  }
  if (fs::is_symlink(fs::symlink_status(p, ec))) {
    const fs::path real = fs::weakly_canonical(p, ec);
    if (!ec) p = real;
  }
  fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (!fs::is_directory(dir, ec)) throw InputError(flag + " " + file + ": directory " + dir.string() + " does not exist");
  if (access(dir.c_str(), W_OK) != 0) throw InputError(flag + " " + file + ": directory " + dir.string() + " is not writable");
}

std::string fmt_double(double v, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", precision, v);
  return buf;
}

}  // namespace g3::cli

namespace g3::cli {

g3::ModelConfig model_from_args(const Args& a, const std::string& default_model) {
  if (a.has("model") && a.has("config")) throw InputError("give either --model or --config, not both");
  if (a.has("config")) return load_config_file(a.str("config"));
  if (a.has("model")) return builtin_model(a.str("model"));
  if (!default_model.empty()) return builtin_model(default_model);
  throw InputError("--model NAME or --config FILE is required (models: 270m, 1b, 4b, 12b, 27b)");
}

}  // namespace g3::cli
