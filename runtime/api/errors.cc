// Version, status names and the thread-local error message of the C API,
// and the name checks every entry point shares.
#include <string>

#include "runtime/api/api.h"
#include "runtime/dispatch/isa.h"
#include "runtime/dispatch/kernel_registry.h"

namespace g3::api {

namespace {
// One message per thread, so concurrent callers never see each other's.
thread_local std::string t_message;
}  // namespace

void fail(g3attn_status status, std::string message) { throw Error{status, std::move(message)}; }

g3attn_status set_error(const char* fn, g3attn_status status, const std::string& message) {
  try {
    t_message = std::string(fn) + ": " + message;
  } catch (...) {
    // Out of memory while building the message: the status still says so.
    t_message.clear();
  }
  return status;
}

void clear_error() { t_message.clear(); }

DType to_dtype(int d, const char* what) {
  if (d == G3ATTN_F32) return DType::F32;
  if (d == G3ATTN_BF16) return DType::BF16;
  fail(G3ATTN_ERROR_ARGUMENT, std::string(what) + " = " + std::to_string(d) +
                                  " is not a dtype (G3ATTN_F32 = 0, G3ATTN_BF16 = 1)");
}

std::string resolve_isa_name(const std::string& name) {
  std::string asked;
  try {
    asked = requested_isa(name);
  } catch (const InputError& e) {
    fail(G3ATTN_ERROR_NAME, e.what());
  }
  try {
    return resolve_isa(asked);
  } catch (const InputError& e) {
    fail(G3ATTN_ERROR_UNAVAILABLE, e.what());
  }
}

std::string backend_name(const std::string& name) {
  try {
    return parse_backend(name);
  } catch (const InputError& e) {
    fail(G3ATTN_ERROR_NAME, e.what());
  }
}

}  // namespace g3::api

using namespace g3::api;

extern "C" {

const char* g3attn_version(void) { return G3ATTN_VERSION_STRING; }

int g3attn_abi_version(void) { return G3ATTN_ABI_VERSION; }

const char* g3attn_last_error(void) { return t_message.c_str(); }

const char* g3attn_status_name(g3attn_status status) {
  switch (enum_value(status)) {
    case G3ATTN_OK: return "ok";
    case G3ATTN_ERROR_NULL: return "null";
    case G3ATTN_ERROR_ARGUMENT: return "argument";
    case G3ATTN_ERROR_NAME: return "name";
    case G3ATTN_ERROR_INPUT: return "input";
    case G3ATTN_ERROR_UNAVAILABLE: return "unavailable";
    case G3ATTN_ERROR_CACHE: return "cache";
    case G3ATTN_ERROR_MEMORY: return "memory";
    case G3ATTN_ERROR_INTERNAL: return "internal";
  }
  return "unknown";
}

}  // extern "C"
