// The C API's side of the house (include/g3attn/g3attn.h): what its opaque
// handles hold, and the one way every entry point turns C++ failures into a
// status and a thread-local message. Private to runtime/api/.
#pragma once
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "g3attn/g3attn.h"
#include "generator/catalogue.h"
#include "generator/errors.h"
#include "generator/kernel_key.h"
#include "runtime/dispatch/onednn_route.h"
#include "runtime/exec/block.h"
#include "runtime/exec/head_range.h"
#include "runtime/exec/kv_cache.h"
#include "runtime/exec/thread_pool.h"
#include "runtime/io/checkpoint.h"
#include "runtime/io/layer_weights.h"

namespace g3::api {

// A failure with the status it maps to. Entry points throw it for what they
// check themselves; InputError from the rooms below gets the status the
// entry point names for it (see guard).
struct Error {
  g3attn_status status;
  std::string message;
};
[[noreturn]] void fail(g3attn_status status, std::string message);

// Records the calling thread's message (prefixed with the function's name).
g3attn_status set_error(const char* fn, g3attn_status status, const std::string& message);
void clear_error();

// Runs body() and turns whatever it throws into a status: Error as given,
// InputError as `input_status` (what bad input means for this entry point),
// bad_alloc as memory, anything else as internal. Nothing escapes.
template <class F>
g3attn_status guard(const char* fn, g3attn_status input_status, F&& body) noexcept {
  try {
    body();
    clear_error();
    return G3ATTN_OK;
  } catch (const Error& e) {
    return set_error(fn, e.status, e.message);
  } catch (const InputError& e) {
    return set_error(fn, input_status, e.what());
  } catch (const std::bad_alloc&) {
    return set_error(fn, G3ATTN_ERROR_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return set_error(fn, G3ATTN_ERROR_INTERNAL, e.what());
  } catch (...) {
    return set_error(fn, G3ATTN_ERROR_INTERNAL, "unknown exception");
  }
}

// Null checks that name the argument.
template <class T>
T* need(T* p, const char* name) {
  if (!p) fail(G3ATTN_ERROR_NULL, std::string(name) + " is null");
  return p;
}

// The int a C caller passed in an enum argument or field. C lets any int
// through an enum type, but in C++ loading a value outside the enum's range
// as that type is undefined (UBSan's -fsanitize=enum flags it), so enum
// inputs are read as ints before they are checked.
template <class E>
int enum_value(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "the API's enums are int-sized");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// An enum_value of g3attn_dtype; G3ATTN_ERROR_ARGUMENT for other values.
DType to_dtype(int d, const char* what);
// An ISA name: "" means $G3ATTN_ISA, else best. Unknown names are
// G3ATTN_ERROR_NAME, ones this CPU or build cannot run G3ATTN_ERROR_UNAVAILABLE.
std::string resolve_isa_name(const std::string& name);
// A backend name, validated (G3ATTN_ERROR_NAME).
std::string backend_name(const std::string& name);

// What a context shares with the layers made in it: the resolved options
// and the thread pools.
struct Context {
  std::string backend, isa;
  DType kv_dtype = DType::F32, compute = DType::F32;
  ProjectionRoute proj = ProjectionRoute::Auto;
  std::unique_ptr<ThreadPool> pool;
  // The pool of a call's thread count (g3attn.h "Threads and lifetimes").
  ThreadPool& pool_for(int threads);

 private:
  std::mutex mu_;
  std::map<int, std::unique_ptr<ThreadPool>> sized_;
};

// Where a layer's tensors come from.
struct Weights {
  enum class Kind { Checkpoint, Random, Tensors } kind = Kind::Random;
  std::shared_ptr<const Checkpoint> checkpoint;
  uint64_t seed = 0;
  DType dtype = DType::BF16;
  g3attn_tensors tensors{};
  // The weights of KV heads `r` of the layer `full` (the whole layer when r
  // covers every head); reads only what the range needs.
  LayerWeights load(const LayerSpec& full, HeadRange r) const;
};

// A layer ready to run, shared by the handle and the caches made from it.
struct Layer {
  std::shared_ptr<Context> context;
  LayerSpec full;         // the whole layer
  HeadRange range;        // the KV heads this layer runs
  PreparedLayer prepared; // spec = the range's
  // The backend `reference` runs calls without a cache on the official
  // block, which takes the HF-layout weights.
  std::shared_ptr<const LayerWeights> reference_weights;
  std::string key, backend, decode_backend, isa, fallback;
};

}  // namespace g3::api

// The opaque handles of g3attn.h.
struct g3attn_model {
  g3::ModelConfig config;
};
struct g3attn_options {
  std::string backend = "auto";
  std::string isa;  // "" = $G3ATTN_ISA, else best
  g3::DType kv_dtype = g3::DType::F32, compute = g3::DType::F32;
  g3::ProjectionRoute proj = g3::ProjectionRoute::Auto;
  int threads = 0;
};
struct g3attn_context {
  std::shared_ptr<g3::api::Context> s;
};
struct g3attn_weights {
  std::shared_ptr<const g3::api::Weights> s;
};
struct g3attn_layer {
  std::shared_ptr<const g3::api::Layer> s;
};
struct g3attn_cache {
  std::shared_ptr<const g3::api::Layer> layer;
  std::unique_ptr<g3::LayerKvCache> kv;
};
