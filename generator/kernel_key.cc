#include "generator/kernel_key.h"

#include <cstdio>

#include "generator/errors.h"

namespace g3 {

const char* to_string(DType d) { return d == DType::F32 ? "f32" : "bf16"; }

DType parse_dtype(const std::string& s, const std::string& flag) {
  if (s == "f32") return DType::F32;
  if (s == "bf16") return DType::BF16;
  throw InputError(flag + ": unknown dtype '" + s + "' (valid: f32, bf16)");
}

static std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string KernelKey::str() const {
  std::string s = "dh" + std::to_string(head_dim) + "_g" + std::to_string(group) + "_";
  s += window > 0 ? "local" + std::to_string(window) : std::string("global");
  s += "_b" + num(rope_base) + "_s" + num(rope_scale) + "_a" + num(alpha);
  s += std::string("_kv") + to_string(kv_dtype);
  if (compute == DType::BF16) s += "_cbf16";
  // Last, because attention kernels do not depend on it (the Highway
  // generator strips it from the keys it generates).
  s += std::string("_w") + to_string(weight_dtype);
  return s;
}

std::string key_ident(const std::string& key) {
  std::string s;
  for (char c : key) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_') s += c;
    else if (c == '.') s += 'p';
    else if (c == '-') s += 'm';
    else if (c == '+') continue;
    else s += 'x';
  }
  return s;
}

std::string KernelKey::ident() const { return key_ident(str()); }

KernelKey kernel_key(const LayerSpec& l, DType kv, DType weights, DType compute) {
  KernelKey k;
  k.head_dim = l.head_dim;
  k.group = l.group();
  k.window = l.window;
  k.rope_base = l.rope_base;
  k.rope_scale = l.rope_scale;
  k.alpha = l.alpha;
  k.kv_dtype = kv;
  k.weight_dtype = weights;
  k.compute = compute;
  return k;
}

std::vector<KernelKey> distinct_keys(const ModelConfig& m, DType kv, DType weights, DType compute) {
  std::vector<KernelKey> keys;
  for (const LayerSpec& l : layer_specs(m)) {
    KernelKey k = kernel_key(l, kv, weights, compute);
    bool seen = false;
    for (const auto& e : keys) seen = seen || e == k;
    if (!seen) keys.push_back(k);
  }
  return keys;
}

}  // namespace g3
