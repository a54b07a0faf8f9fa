// Helpers of the C API suites: owning wrappers for the API's handles, status
// checks that print the thread-local message, and the golden cases read into
// plain arrays. Only the public header is used to reach the library.
#pragma once
#include <catch2/catch.hpp>
#include <g3attn/g3attn.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/test_support.h"

namespace g3apitest {

struct ModelDel { void operator()(g3attn_model* p) const { g3attn_model_free(p); } };
struct OptionsDel { void operator()(g3attn_options* p) const { g3attn_options_free(p); } };
struct ContextDel { void operator()(g3attn_context* p) const { g3attn_context_free(p); } };
struct WeightsDel { void operator()(g3attn_weights* p) const { g3attn_weights_free(p); } };
struct LayerDel { void operator()(g3attn_layer* p) const { g3attn_layer_free(p); } };
struct CacheDel { void operator()(g3attn_cache* p) const { g3attn_cache_free(p); } };
using Model = std::unique_ptr<g3attn_model, ModelDel>;
using Options = std::unique_ptr<g3attn_options, OptionsDel>;
using Context = std::unique_ptr<g3attn_context, ContextDel>;
using Weights = std::unique_ptr<g3attn_weights, WeightsDel>;
using Layer = std::unique_ptr<g3attn_layer, LayerDel>;
using Cache = std::unique_ptr<g3attn_cache, CacheDel>;

// A call that must succeed; on failure the test stops with the message.
#define API_OK(call)                                                                          \
  do {                                                                                        \
    const g3attn_status api_status_ = (call);                                                 \
    INFO(#call << " -> " << g3attn_status_name(api_status_) << ": " << g3attn_last_error()); \
    REQUIRE(api_status_ == G3ATTN_OK);                                                        \
  } while (0)

// A call that must fail with `want`, leaving a message that names the
// function and contains `part`.
#define API_FAILS(call, want, part)                                                               \
  do {                                                                                            \
    const g3attn_status api_status_ = (call);                                                     \
    const std::string api_msg_ = g3attn_last_error();                                            \
    INFO(#call << " -> " << g3attn_status_name(api_status_) << ": " << api_msg_);                 \
    CHECK(api_status_ == (want));                                                                 \
    CHECK(api_msg_.find("g3attn_") == 0);                                                         \
    CHECK(api_msg_.find(part) != std::string::npos);                                              \
  } while (0)

Model builtin(const char* name);
Model load_model(const std::string& config_path);
Model model_from_json(const std::string& json);
// A context with these settings (backend "auto" and threads 2 by default).
Context context(const char* backend = "auto", g3attn_dtype kv = G3ATTN_F32, g3attn_dtype compute = G3ATTN_F32,
                int threads = 2);
Weights open_weights(const std::string& path, const g3attn_model* model);
Weights random_weights(uint64_t seed, g3attn_dtype dtype = G3ATTN_BF16);
Layer make_layer(g3attn_context* c, const g3attn_model* m, int layer, const g3attn_weights* w);
Layer make_heads(g3attn_context* c, const g3attn_model* m, int layer, const g3attn_weights* w, int j0, int j1);
Cache make_cache(const g3attn_layer* l, int64_t batch, int64_t context, int64_t chunk);

// One golden case (tests/golden/README.md) as the API takes it.
struct Golden {
  std::string dir;
  int64_t B = 0, T = 0, D = 0;
  int layer = 0;
  std::vector<float> x, attn_out, block_out;
  std::vector<int32_t> positions;
  std::vector<uint8_t> real;
  std::vector<bool> real_row;
};
Golden read_golden(const std::string& name);

// Inputs of the API suites' own cases: N(0, 1) from a seed.
using g3test::randn;
// max |a - b| over rows where row_ok (all rows when empty); NaN counts as inf.
double max_diff(const std::vector<float>& a, const std::vector<float>& b, int64_t width = 1,
                const std::vector<bool>& row_ok = {});
double max_abs(const std::vector<float>& a);

// The small geometry the runtime suites use (D64, N4, Nkv2, dh16, W4),
// with `kv_heads` KV heads and twice as many query heads, as config.json text.
std::string tiny_config_json(int kv_heads = 2);

}  // namespace g3apitest
