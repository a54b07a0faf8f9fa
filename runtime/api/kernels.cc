// The C API's kernel lookup by key: a kernel key string (generator/
// kernel_key.h's format) read back into a KernelKey, then the kernel
// registry's table for a backend and ISA (dispatch/kernel_registry.h).
#include <cmath>
#include <cstdlib>
#include <set>
#include <vector>

#include "runtime/api/api.h"
#include "runtime/dispatch/kernel_registry.h"

namespace g3::api {

namespace {

[[noreturn]] void bad_key(const std::string& key, const std::string& why) {
  fail(G3ATTN_ERROR_NAME, "'" + key + "' is not a kernel key (" + why +
                              "; the format is dh<head_dim>_g<group>_local<W>|global_b<rope base>_s<rope scale>"
                              "_a<alpha>_kv<f32|bf16>[_cbf16]_w<f32|bf16>, as g3attn_model_layer_key writes it)");
}

bool take_int(const std::string& field, const char* prefix, int64_t lo, int64_t hi, int* out) {
  const std::string p = prefix;
  if (field.compare(0, p.size(), p) != 0 || field.size() == p.size()) return false;
  int64_t v = 0;
  for (size_t i = p.size(); i < field.size(); ++i) {
    if (field[i] < '0' || field[i] > '9' || v > hi) return false;
    v = v * 10 + (field[i] - '0');
  }
  if (v < lo || v > hi) return false;
  *out = int(v);
  return true;
}

bool take_num(const std::string& field, char prefix, double* out) {
  if (field.size() < 2 || field[0] != prefix) return false;
  const char* s = field.c_str() + 1;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end != field.c_str() + field.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool take_dtype(const std::string& field, const char* prefix, DType* out) {
  const std::string p = prefix;
  if (field == p + "f32") *out = DType::F32;
  else if (field == p + "bf16") *out = DType::BF16;
  else return false;
  return true;
}

// The inverse of KernelKey::str(), with the catalogue's bounds (validate()
// in catalogue.h), so a key names only kernels a config could ask for.
KernelKey parse_key(const std::string& key) {
  std::vector<std::string> f;
  size_t at = 0;
  for (;;) {
    const size_t u = key.find('_', at);
    f.push_back(key.substr(at, u == std::string::npos ? std::string::npos : u - at));
    if (u == std::string::npos) break;
    at = u + 1;
  }
  if (f.size() != 8 && f.size() != 9) bad_key(key, "it has " + std::to_string(f.size()) + " fields, not 8 or 9");
  KernelKey k;
  if (!take_int(f[0], "dh", 2, 1024, &k.head_dim) || k.head_dim % 2)
    bad_key(key, "head_dim must be an even number in 2..1024");
  if (!take_int(f[1], "g", 1, 1024, &k.group)) bad_key(key, "the group must be in 1..1024");
  if (f[2] == "global") k.window = 0;
  else if (!take_int(f[2], "local", 1, int64_t{1} << 30, &k.window)) bad_key(key, "the kind must be local<W> or global");
  double alpha = 0;
  if (!take_num(f[3], 'b', &k.rope_base) || !(k.rope_base > 0)) bad_key(key, "the rope base must be positive");
  if (!take_num(f[4], 's', &k.rope_scale) || !(k.rope_scale >= 1 && k.rope_scale <= 1e6))
    bad_key(key, "the rope scale must be in [1, 1e6]");
  if (!take_num(f[5], 'a', &alpha) || !(alpha > 0 && alpha < 1e3)) bad_key(key, "alpha must be positive");
  k.alpha = float(alpha);
  if (!take_dtype(f[6], "kv", &k.kv_dtype)) bad_key(key, "the KV dtype must be kvf32 or kvbf16");
  size_t w = 7;
  if (f.size() == 9) {
    if (f[7] != "cbf16") bad_key(key, "the compute field must be cbf16");
    k.compute = DType::BF16;
    w = 8;
  }
  if (!take_dtype(f[w], "w", &k.weight_dtype)) bad_key(key, "the weight dtype must be wf32 or wbf16");
  return k;
}

// The strings handed out live until the process ends, as the kernels do.
const char* intern(const std::string& s) {
  static std::mutex mu;
  static std::set<std::string>* strings = new std::set<std::string>();  // never destroyed: callers may outlive statics
  std::lock_guard<std::mutex> lock(mu);
  return strings->insert(s).first->c_str();
}

}  // namespace

}  // namespace g3::api

using namespace g3;
using namespace g3::api;

extern "C" {

g3attn_status g3attn_kernels_for_key(const char* key, const char* backend, const char* isa, g3attn_kernels* out) {
  return guard("g3attn_kernels_for_key", G3ATTN_ERROR_UNAVAILABLE, [&] {
    const KernelKey k = parse_key(need(key, "key"));
    need(out, "out");
    const std::string b = backend_name(backend ? backend : "auto");
    const std::string i = resolve_isa_name(isa ? isa : "");
    const KernelChoice c = kernels_for(k, b, i, Phase::Prefill);
    g3attn_kernels r{};
    r.table = c.kernels.table;
    r.backend = intern(c.backend);
    r.isa = intern(c.kernels.isa);
    r.fallback = intern(c.fallback);
    r.specialised = c.kernels.specialised ? 1 : 0;
    *out = r;
  });
}

}  // extern "C"
