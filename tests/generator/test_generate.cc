// `g3attn generate`: the written tree builds on its own with nothing but
// Highway, and its smoke test passes; bad input is exit code 2.
#include <catch2/catch.hpp>
#include <string>

#include "tests/support/test_support.h"

namespace {

std::string q(const std::string& s) { return "'" + s + "'"; }

}  // namespace

TEST_CASE("generate rejects bad input with exit code 2", "[generate]") {
  g3test::TempDir t;
  auto r = g3test::run_g3attn({"generate", "--model", "1b"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--out") != std::string::npos);
  r = g3test::run_g3attn({"generate", "--model", "2b", "--out", t.file("x")});
  CHECK(r.exit_code == 2);
  r = g3test::run_g3attn({"generate", "--model", "1b", "--kv-dtype", "f16", "--out", t.file("x")});
  CHECK(r.exit_code == 2);
  r = g3test::run_g3attn({"generate", "--out", t.file("x")});
  CHECK(r.exit_code == 2);
  g3test::write_text(t.file("file"), "x");
  r = g3test::run_g3attn({"generate", "--model", "1b", "--out", t.file("file")});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find('\n') == r.err.size() - 1);  // one line
}

TEST_CASE("generate --model 1b writes a tree that builds standalone with Highway", "[generate][standalone]") {
  // About a minute on 2 idle cores: four kernel keys, six targets each.
  g3test::TempDir t;
  const std::string dir = t.file("gen");
  auto r = g3test::run_g3attn({"generate", "--model", "1b", "--out", dir});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  for (const char* f : {"CMakeLists.txt", "README.md", "kernel_contract.h", "mask_rule.h", "scratch.h",
                        "decode_prefetch.h", "bf16-inl.h", "softmax-inl.h", "hwy_targets.h",
                        "attention-inl.h", "attention_key-inl.h", "attention_registry.h", "hwy_attention_registry.cc", "check.cc"})
    CHECK(g3test::file_exists(dir + "/" + f));
  CHECK(g3test::read_text(dir + "/hwy_attention_registry.cc").find("dh256_g4_local512") != std::string::npos);
  auto c = g3test::run_shell("cmake -S " + q(dir) + " -B " + q(dir + "/build") + " -DCMAKE_BUILD_TYPE=Release");
  INFO(c.out << c.err);
  REQUIRE(c.exit_code == 0);
  auto b = g3test::run_shell("cmake --build " + q(dir + "/build") + " -j2");
  INFO(b.out << b.err);
  REQUIRE(b.exit_code == 0);
  auto x = g3test::run_shell(q(dir + "/build/g3attn_kernels_check"));
  INFO(x.out << x.err);
  CHECK(x.exit_code == 0);
  CHECK(x.out.find("WRONG") == std::string::npos);
}
