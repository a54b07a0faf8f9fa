// What only the Highway AOT backend has: the targets compiled into this
// binary, and specialised kernels for the built-in keys (generated per key
// at build time) next to the generic kernel with runtime parameters for any
// other key. Its kernels are checked against the reference on every target
// by the conformance suite (test_conformance: core, QK stage, block, golden
// cases), which also asserts specialised-vs-generic on every key it runs.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "generator/backend_api.h"
#include "generator/catalogue.h"
#include "generator/errors.h"
#include "generator/kernel_key.h"
#include "runtime/dispatch/isa.h"
#include "tests/support/test_support.h"

TEST_CASE("highway compiles the scalar target and the ISAs the build promises", "[hwy]") {
  auto isas = g3::highway_compiled_isas();
  REQUIRE(!isas.empty());
  CHECK(isas.front() == "scalar");
  for (const auto& i : isas) CHECK(g3::isa_compiled(i));
  const g3::KernelKey k = g3::distinct_keys(g3::builtin_model("1b"), g3::DType::F32, g3::DType::BF16).at(0);
  CHECK_THROWS_AS(g3::highway_kernels(k, "bogus"), g3::InputError);
}

TEST_CASE("highway kernels are specialised for built-in keys and generic otherwise", "[hwy]") {
  const std::vector<std::string> isas = g3test::highway_test_isas();
  REQUIRE_FALSE(isas.empty());  // at least Highway's scalar target always runs
  for (const auto& isa : isas) {
    for (const auto& name : g3::builtin_model_names())
      for (g3::DType kv : {g3::DType::F32, g3::DType::BF16})
        for (g3::DType w : {g3::DType::F32, g3::DType::BF16})
          for (const auto& k : g3::distinct_keys(g3::builtin_model(name), kv, w)) {
            g3::BackendKernels b = g3::highway_kernels(k, isa);
            INFO(name << " " << k.str() << " on " << isa);
            CHECK(b.specialised);
            CHECK(b.isa == isa);
            CHECK(b.table.qk != nullptr);
            CHECK(b.table.core != nullptr);
          }
    g3::KernelKey odd = g3::distinct_keys(g3::builtin_model("1b"), g3::DType::F32, g3::DType::BF16).at(0);
    odd.head_dim = 48;
    g3::BackendKernels b = g3::highway_kernels(odd, isa);
    CHECK_FALSE(b.specialised);
    CHECK(b.table.core != nullptr);
    CHECK(!b.note.empty());
  }
}
