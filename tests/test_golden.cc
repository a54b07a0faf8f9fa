// The golden cases of ../shared/golden through the same code path as
// `g3attn apply` (run_apply), valid rows only, with the README's tolerances.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "apply.h"
#include "npy.h"
#include "test_support.h"

namespace {

void check_case(const std::string& name, const std::string& backend, const std::string& isa) {
  g3test::GoldenCheck g = g3test::check_golden_case(name, backend, isa);
  INFO(name << " backend " << g.backend << " isa " << g.isa << ": attn max diff " << g.attn_max
            << ", block max diff " << g.block_max);
  CHECK(g.bad_attn == 0);
  CHECK(g.bad_block == 0);
}

}  // namespace

TEST_CASE("reference reproduces every golden case", "[golden][reference]") {
  auto cases = g3test::golden_cases();
  REQUIRE(cases.size() >= 10);
  for (const auto& c : cases) {
    SECTION(c) { check_case(c, "reference", ""); }
  }
}

TEST_CASE("the contract path with the scalar kernels reproduces every golden case", "[golden][contract]") {
  // backend "auto" on a build without faster backends, or the reference kernels
  // through run_block_nocache: both go through the kernel contract.
  for (const auto& c : g3test::golden_cases()) {
    SECTION(c) { check_case(c, "auto", "scalar"); }
  }
}
