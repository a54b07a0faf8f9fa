// The golden cases (the full set of ../shared/golden, or the in-repo subset
// tests/golden; test_support.h says which) through the same code path as
// `g3attn apply` (run_apply), valid rows only, with the README's tolerances.
// Each check asserts which backend actually ran: the reference, and for
// "auto" on the scalar ISA the backend the auto rule names for f32 KV.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "runtime/exec/apply.h"
#include "runtime/io/npy.h"
#include "tests/support/test_support.h"

namespace {

void check_case(const std::string& name, const std::string& backend, const std::string& isa,
                const std::string& expect_backend) {
  g3test::GoldenCheck g = g3test::check_golden_case(name, backend, isa);
  INFO(name << " backend " << g.backend << " isa " << g.isa << ": attn max diff " << g.attn_max
            << ", block max diff " << g.block_max);
  CHECK(g.backend == expect_backend);
  if (!isa.empty()) CHECK(g.isa == isa);
  CHECK(g.bad_attn == 0);
  CHECK(g.bad_block == 0);
}

// README: auto takes highway for f32 KV (the golden cases' KV type), the
// reference kernels when Highway is not built.
std::string auto_f32_backend() {
#ifdef G3_HIGHWAY_AVAILABLE
  return "highway";
#else
  return "reference";
#endif
}

}  // namespace

TEST_CASE("reference reproduces every golden case", "[golden][reference]") {
  // golden_cases() fails when the set holds fewer cases than it should.
  for (const auto& c : g3test::golden_cases()) {
    SECTION(c) { check_case(c, "reference", "", "reference"); }
  }
}

TEST_CASE("the contract path with the scalar kernels reproduces every golden case", "[golden][contract]") {
  // backend "auto" on the scalar ISA: Highway's scalar target through the
  // kernel contract and run_block_nocache (the reference's kernels when
  // Highway is not built).
  for (const auto& c : g3test::golden_cases()) {
    SECTION(c) {
      check_case(c, "auto", "scalar", auto_f32_backend());
    }
  }
}
