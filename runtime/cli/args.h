// Argument parsing shared by the g3attn subcommands: declared options only,
// `--name value` pairs, switches, and `--json [FILE]` whose value is optional.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runtime/report/text_table.h"

namespace g3::cli {

enum class Arity { Switch, Value, OptionalValue };

struct Option {
  std::string name;     // without the dashes
  Arity arity;
  std::string meta;     // "FILE", "N", ... (empty for switches)
  std::string help;     // one line, including the default
};

class Args {
 public:
  // Parses argv[first..]; throws InputError on an unknown option, a missing
  // value or a repeated option. `--help` sets help().
  Args(const std::string& command, const std::vector<Option>& options, int argc, char** argv, int first);
  bool help() const { return help_; }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  // Value of a Value/OptionalValue option ("" when given without a value).
  std::string str(const std::string& name, const std::string& def = "") const;
  long long integer(const std::string& name, long long def, long long lo, long long hi) const;
  std::vector<std::string> list(const std::string& name, const std::string& def) const;  // comma-separated
  std::string usage() const;

 private:
  std::string command_;
  std::vector<Option> options_;
  std::map<std::string, std::string> values_;
  bool help_ = false;
};

// Options every kernel-running command takes.
std::vector<Option> common_kernel_options();

// The elements of a comma-separated list; InputError "<what>: empty list" or
// "<what>: empty element in '<s>'" (a typo like `1b,,4b` is not skipped).
std::vector<std::string> split_list(const std::string& s, const std::string& what);

// Writes JSON text: to stdout when `--json` was given alone, to FILE
// atomically when `--json FILE`.
void emit_json(const Args& a, const std::string& text);
// Checks before any work that FILE can be written: not a directory, and
// its directory (a symlink's target's) exists and is writable, or, for a
// device or FIFO, FILE itself is writable. Throws InputError naming the flag.
void check_output_path(const std::string& file, const std::string& flag);
std::string fmt_double(double v, int precision = 6);

}  // namespace g3::cli

#include "generator/catalogue.h"
namespace g3::cli {
// --model NAME or --config FILE, exactly one (model may default).
g3::ModelConfig model_from_args(const Args& a, const std::string& default_model = "");
}  // namespace g3::cli
