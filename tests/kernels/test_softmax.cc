// The softmax step every core shares (templates/softmax-inl.h), on each
// Highway target this build compiles and the CPU runs, reached through
// flash_ops (what the Xbyak and LLVM cores call). The conformance suite
// checks whole cores against the reference; this checks the exp inside the
// step over its whole argument range, where a core's tolerance would hide a
// polynomial or range-reduction error on the keys that weigh little.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "generator/highway/flash_ops.h"
#include "tests/support/test_support.h"

namespace {

// One full tile of `width` keys for one row: logits in, probabilities out.
struct Tile {
  std::vector<float> s;
  std::vector<int32_t> kp, kv;
  float m = 0, l = 0, corr = 0;
  explicit Tile(size_t width) : s(width), kp(width), kv(width, -1) {
    for (size_t j = 0; j < width; ++j) kp[j] = int32_t(j);
  }
  void run(const g3::FlashOps& ops) {
    const g3_row_bounds rb = {INT32_MIN, INT32_MAX, INT64_MAX};
    ops.softmax_tile(s.data(), int64_t(s.size()), 1, int64_t(s.size()), 1, 0, kp.data(), kv.data(), &rb, &m, &l,
                     &corr);
  }
};

}  // namespace

TEST_CASE("the softmax's exp is within 4 ulp over its whole argument range", "[softmax]") {
  for (const std::string& isa : g3test::highway_test_isas()) {
    const g3::FlashOps& ops = g3::flash_ops(isa);
    INFO("isa cap " << isa << ", Highway target " << ops.isa);
    // Logits 0 (the maximum) down to -102.3 in steps that are not multiples
    // of ln 2, so the reduced arguments r cover [-ln2/2, ln2/2] densely.
    const size_t width = 16 * 640;
    Tile t(width);
    for (size_t j = 0; j < width; ++j) t.s[j] = -float(j) * 0.00999f;
    const std::vector<float> x = t.s;
    ops.init_rows(1, &t.m, &t.l);
    t.run(ops);
    CHECK(t.m == 0.0f);
    CHECK(t.corr <= 5e-38f);  // exp(nothing seen - 0): 0, or the clamp's 4e-38
    double worst = 0, sum = 0;
    for (size_t j = 0; j < width; ++j) {
      const double want = std::exp(double(x[j]));
      sum += want;
      if (x[j] >= -86.0f) {
        worst = std::max(worst, std::fabs(t.s[j] - want) / want);
      } else {
        CHECK(t.s[j] >= 0.0f);
        CHECK(t.s[j] <= 5e-38f);
      }
    }
    CHECK(worst <= 4 * 0x1p-24);
    CHECK(std::fabs(t.l - sum) <= 1e-5 * sum);
    CHECK(t.s[0] == 1.0f);

    // A later tile with a larger maximum: the running state is rescaled by
    // exp(old max - new max).
    Tile u(16);
    for (size_t j = 0; j < 16; ++j) u.s[j] = 3.5f - float(j);
    u.m = t.m;
    u.l = t.l;
    u.run(ops);
    CHECK(u.m == 3.5f);
    CHECK(std::fabs(u.corr - std::exp(-3.5)) <= 4 * 0x1p-24 * std::exp(-3.5));
  }
}
