// The C++ clients' side of the C API (include/g3attn/g3attn.h), for the
// rooms above api/ that run their kernels through it (tp/, cli/): a failed
// call becomes the exception the command's main() reports, with the message
// the rooms below wrote (the API's "g3attn_<function>: " prefix removed, so
// the command says what it always said), handles are owned by unique_ptrs,
// and the runtime's dtypes name the API's. It reaches the library through
// the public header alone, as an engine does.
#pragma once
#include <g3attn/g3attn.h>

#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "generator/errors.h"
#include "generator/kernel_key.h"

namespace g3 {

// Bad input (null, argument, name, input, unavailable, cache) is an
// InputError, exit code 2; out of memory a bad_alloc; a bug in g3attn a
// runtime_error.
inline void api_check(g3attn_status status) {
  if (status == G3ATTN_OK) return;
  std::string msg = g3attn_last_error();
  if (msg.rfind("g3attn_", 0) == 0) {
    const size_t colon = msg.find(": ");
    if (colon != std::string::npos) msg.erase(0, colon + 2);
  }
  if (status == G3ATTN_ERROR_MEMORY) throw std::bad_alloc();
  if (status == G3ATTN_ERROR_INTERNAL) throw std::runtime_error(msg);
  throw InputError(msg);
}

struct ApiFree {
  void operator()(g3attn_model* p) const { g3attn_model_free(p); }
  void operator()(g3attn_options* p) const { g3attn_options_free(p); }
  void operator()(g3attn_context* p) const { g3attn_context_free(p); }
  void operator()(g3attn_weights* p) const { g3attn_weights_free(p); }
  void operator()(g3attn_layer* p) const { g3attn_layer_free(p); }
  void operator()(g3attn_cache* p) const { g3attn_cache_free(p); }
};
template <class T>
using ApiHandle = std::unique_ptr<T, ApiFree>;

inline g3attn_dtype api_dtype(DType d) { return d == DType::BF16 ? G3ATTN_BF16 : G3ATTN_F32; }

}  // namespace g3
