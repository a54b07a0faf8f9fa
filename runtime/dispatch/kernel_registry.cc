#include "runtime/dispatch/kernel_registry.h"

#include <future>
#include <map>
#include <mutex>
#include <stdexcept>

#include "generator/errors.h"

namespace g3 {

const std::vector<std::string>& backend_names() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> names;
    for (const Backend& b : backends()) names.push_back(b.name);
    names.push_back("auto");
    return names;
  }();
  return v;
}

std::string parse_backend(const std::string& name) {
  std::string valid;
  for (const auto& b : backend_names()) {
    if (b == name) return name;
    valid += (valid.empty() ? "" : ", ") + b;
  }
  throw InputError("--backend: unknown backend '" + name + "' (valid: " + valid + ")");
}

namespace {

std::mutex g_mu;
std::map<std::string, int> g_built;

// The one memo of built kernels: the first caller of a (backend, ISA, key)
// builds, concurrent callers wait on the same future. A failed build is
// forgotten, so a later call (e.g. once the JIT's cache directory is
// writable) tries again instead of repeating a stale error.
BackendKernels cached_build(const Backend& backend, const KernelKey& key, const std::string& isa) {
  static std::map<std::string, std::shared_future<BackendKernels>> memo;
  const std::string id = std::string(backend.name) + "|" + isa + "|" + key.str();
  std::promise<BackendKernels> promise;
  std::shared_future<BackendKernels> fut;
  bool mine = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = memo.find(id);
    if (it == memo.end()) {
      fut = promise.get_future().share();
      memo.emplace(id, fut);
      mine = true;
    } else {
      fut = it->second;
    }
  }
  if (mine) {
    try {
      BackendKernels k = backend.build(key, isa);
      {
        std::lock_guard<std::mutex> lock(g_mu);
        ++g_built[backend.name];
      }
      promise.set_value(k);
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(g_mu);
        memo.erase(id);
      }
      promise.set_exception(std::current_exception());
    }
  }
  return fut.get();
}

const Backend& fallback_of(const Backend& b) {
  const Backend* f = b.fallback ? find_backend(b.fallback) : nullptr;
  if (!f) throw std::logic_error(std::string("backend table: ") + b.name + " has no fallback");
  return *f;
}

// The backend's kernels with every stage filled: the stages it leaves null
// come from its fallback's complete table, recursively.
KernelChoice complete(const Backend& b, const KernelKey& key, const std::string& isa) {
  KernelChoice c;
  c.kernels = cached_build(b, key, isa);
  c.backend = b.name;
  KernelChoice fill;
  bool filled = false;
  for (Stage s : kStages) {
    if (has_stage(c.kernels.table, s)) {
      c.stages[s] = b.name;
      continue;
    }
    if (!filled) {
      fill = complete(fallback_of(b), key, isa);
      filled = true;
    }
    copy_stage(c.kernels.table, fill.kernels.table, s);
    c.stages[s] = fill.stages[s];
  }
  return c;
}

}  // namespace

KernelChoice kernels_for(const KernelKey& key, const std::string& name, const std::string& isa, Phase phase) {
  parse_backend(name);
  if (name == "auto") return kernels_for(key, auto_route(key, phase, isa), isa);
  return kernels_for(key, AutoRoute{name, "", false}, isa);
}

KernelChoice kernels_for(const KernelKey& key, const AutoRoute& route, const std::string& isa) {
  const Backend* b = find_backend(route.backend);
  const std::string& source = route.source;
  // A backend that cannot serve the request here falls back, saying why.
  std::string fallback;
  if (const std::string why = b->why_unavailable(key, isa); !why.empty()) {
    const Backend& f = fallback_of(*b);
    fallback = std::string(b->name) + " unavailable (" + why + "), using " + f.name;
    b = &f;
  }
  KernelChoice c = complete(*b, key, isa);
  c.fallback = fallback;
  c.source = source;
  return c;
}

int kernels_built(const std::string& backend) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_built.find(backend);
  return it == g_built.end() ? 0 : it->second;
}

}  // namespace g3
