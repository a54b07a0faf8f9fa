#include "runtime/dispatch/prefetch_route.h"

#include <mutex>

#include "generator/errors.h"
#include "runtime/dispatch/profile.h"
#include "templates/kernel_contract.h"

namespace g3 {

namespace {

std::mutex g_mu;
DecodePrefetch g_setting;
std::string g_source = "default";

}  // namespace

std::string DecodePrefetch::str() const {
  if (level == G3_PREFETCH_DEFAULT) return "default";
  return (level == G3_PREFETCH_L2 ? "l2:" : "l1:") + std::to_string(bytes);
}

DecodePrefetch parse_decode_prefetch(const std::string& s, const std::string& what) {
  if (s == "default") return {};
  const auto bad = [&] {
    return InputError(what + ": '" + s + "' is not a decode prefetch (default, or l1 or l2, a colon and 64 to " +
                      "1048576 bytes: l2:16384)");
  };
  if (s.size() < 4 || (s.compare(0, 3, "l1:") != 0 && s.compare(0, 3, "l2:") != 0)) throw bad();
  const std::string digits = s.substr(3);
  if (digits.empty() || digits.size() > 7 || digits.find_first_not_of("0123456789") != std::string::npos) throw bad();
  const int bytes = std::stoi(digits);
  if (bytes < 64 || bytes > (1 << 20)) throw bad();
  return {s[1] == '2' ? G3_PREFETCH_L2 : G3_PREFETCH_L1, bytes};
}

const std::vector<DecodePrefetch>& decode_prefetch_candidates() {
  static const std::vector<DecodePrefetch> c = {
      {}, {G3_PREFETCH_L2, 16 * 1024}, {G3_PREFETCH_L2, 32 * 1024}};
  return c;
}

DecodePrefetch decode_prefetch() {
  active_profile();  // its setting, if it has one, applies from the first call on
  std::lock_guard<std::mutex> lock(g_mu);
  return g_setting;
}

std::string decode_prefetch_source() {
  active_profile();
  std::lock_guard<std::mutex> lock(g_mu);
  return g_source;
}

void set_decode_prefetch(const DecodePrefetch& p, const std::string& source) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_setting = p;
  g_source = source;
}

}  // namespace g3
