#include "runtime/dispatch/isa.h"

#include <hwy/highway.h>

#include <cstdlib>

#include "generator/errors.h"

namespace g3 {

static std::string valid_list() {
  std::string s;
  for (const auto& n : isa_names()) s += n + ", ";
  return s + "best";
}

std::string requested_isa(const std::string& flag) {
  std::string name = flag, from = "--isa";
  if (name.empty()) {
    const char* env = std::getenv("G3ATTN_ISA");
    if (env && *env) {
      name = env;
      from = "G3ATTN_ISA";
    } else {
      return "best";
    }
  }
  if (name != "best" && isa_target_bit(name) == 0)
    throw InputError(from + ": unknown ISA '" + name + "' (valid: " + valid_list() + ")");
  return name;
}

bool isa_supported_by_cpu(const std::string& n) {
  const int64_t bit = isa_target_bit(n);
  return bit != 0 && target_runs_here(bit);
}

std::string isa_unavailable_reason(const std::string& n) {
  if (isa_target_bit(n) == 0) return "unknown ISA '" + n + "'";
  if (!isa_compiled(n)) return n + " is not compiled into this build";
  if (!isa_supported_by_cpu(n)) return "this CPU does not support " + n;
  return "";
}

std::vector<std::string> runnable_isas() {
  std::vector<std::string> v;
  for (const auto& n : isa_names())
    if (isa_unavailable_reason(n).empty()) v.push_back(n);
  return v;
}

std::string best_isa() {
  auto v = runnable_isas();
  return v.empty() ? "scalar" : v.back();
}

std::string resolve_isa(const std::string& name) {
  if (name == "best") return best_isa();
  std::string why = isa_unavailable_reason(name);
  if (!why.empty()) throw InputError("--isa " + name + ": " + why);
  return name;
}

std::string isa_from_flag(const std::string& flag) { return resolve_isa(requested_isa(flag)); }

}  // namespace g3
