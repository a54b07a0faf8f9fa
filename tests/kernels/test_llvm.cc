// What only the LLVM ORC backend has: its availability, the target an ISA
// cap compiles for, one build per key and cap in a process, and its on-disk
// object cache (hits across cache objects and processes, corrupt entries
// detected and recompiled with a warning, unwritable directories tolerated,
// concurrent writers leaving one valid entry). Its kernels are checked
// against the reference on every ISA cap by the conformance suite
// (test_conformance: core, QK stage, block, golden cases); the cache file
// format alone by test_jit_cache.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "generator/backend_api.h"
#include "generator/llvm/jit_cache.h"
#include "generator/llvm/llvm_backend.h"
#include "runtime/dispatch/kernel_registry.h"
#include "runtime/reference/reference.h"
#include "tests/support/kernel_calls.h"
#include "tests/support/test_support.h"

namespace {

// Every run compiles from scratch into its own cache directory.
const g3test::ScratchJitCache g_scratch_cache;

}  // namespace

TEST_CASE("llvm backend is available", "[llvm]") {
  std::string why;
  REQUIRE(g3::llvm_available(&why));
  g3::LlvmTarget t = g3::llvm_target_for("avx2");
  CHECK(t.vector_bits == 256);
  CHECK(g3::llvm_target_for("scalar").vector_bits == 128);
}

TEST_CASE("llvm kernels for one key are built once per process", "[llvm]") {
  // The kernel registry is the one memo of built kernels.
  const g3::KernelKey key{.head_dim = 64, .group = 4, .rope_base = 1e6, .alpha = 0.125f};
  g3::BackendKernels a = g3::kernels_for(key, "llvm", "avx2").kernels;
  int before = g3::llvm_compiles() + g3::llvm_cache_hits();
  g3::BackendKernels b = g3::kernels_for(key, "llvm", "avx2").kernels;
  CHECK(g3::llvm_compiles() + g3::llvm_cache_hits() == before);
  CHECK(a.table.core == b.table.core);
}

// ---------------------------------------------------------------------------
// The on-disk object cache under the backend.

namespace {

g3::KernelKey test_key() { return {.head_dim = 64, .group = 2, .window = 13, .rope_base = 1e4, .alpha = 0.125f}; }

// A small core call checked against the reference: the object that came
// back (compiled or from the cache) really works.
void check_works(const g3::BackendKernels& k) {
  const g3test::CoreCall d = g3test::CoreCall::random(
      {.head_dim = 64, .group = 2, .window = 13, .T = 3, .S = 20, .order = g3test::SlotOrder::Sorted, .invalid = 0});
  const g3test::CoreCall::Outputs got = d.run(k.table.core), want = d.run(&g3::ref::core);
  int64_t bad = 0;
  double diff = g3test::max_abs_diff(got.out.data(), want.out.data(), 3, d.out_stride, {}, 2e-5, 2e-5, &bad);
  INFO("max diff " << diff);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("a second compile of a key in a fresh cache object hits the disk cache", "[jit_cache][llvm]") {
  g3test::TempDir d;
  g3::KernelKey key = test_key();
  const int c0 = g3::llvm_compiles(), h0 = g3::llvm_cache_hits();
  {
    g3::JitCache c1(d.path);
    g3::BackendKernels k = g3::llvm_kernels_with(key, "avx2", &c1);
    CHECK_FALSE(k.cached);
    check_works(k);
  }
  CHECK(g3::llvm_compiles() == c0 + 1);
  CHECK(g3::llvm_cache_hits() == h0);
  CHECK(g3test::files_ending(d.path, ".g3o").size() == 1);
  CHECK(g3test::count_entries(d.path) == 1);
  g3::JitCache c2(d.path);
  g3::BackendKernels k = g3::llvm_kernels_with(key, "avx2", &c2);
  CHECK(k.cached);
  CHECK(g3::llvm_compiles() == c0 + 1);
  CHECK(g3::llvm_cache_hits() == h0 + 1);
  check_works(k);
  std::printf("llvm kernel %s avx2: compiled, then from the disk cache in %.2f ms\n", key.str().c_str(),
              k.compile_ms);
  // Another ISA cap is another entry.
  g3::llvm_kernels_with(key, "sse4", &c2);
  CHECK(g3test::files_ending(d.path, ".g3o").size() == 2);
}

TEST_CASE("a corrupt cache entry is recompiled with a warning", "[jit_cache][llvm]") {
  g3::KernelKey key = test_key();
  for (const std::string damage : {"truncate", "garbage", "bitflip"}) {
    SECTION(damage) {
      g3test::TempDir d;
      g3::JitCache c(d.path);
      g3::llvm_kernels_with(key, "avx2", &c);
      auto files = g3test::files_ending(d.path, ".g3o");
      REQUIRE(files.size() == 1);
      std::vector<uint8_t> bytes = g3test::read_bytes(files[0]);
      const std::vector<uint8_t> good = bytes;
      if (damage == "truncate") bytes.resize(bytes.size() * 2 / 3);
      else if (damage == "garbage")
        for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 131 + 17);
      else bytes[bytes.size() / 2] ^= 0x40;
      g3test::write_bytes(files[0], bytes);

      const int c0 = g3::llvm_compiles(), h0 = g3::llvm_cache_hits();
      g3test::TempDir logdir;
      g3test::StderrCapture cap(logdir.file("stderr"));
      g3::JitCache fresh(d.path);
      g3::BackendKernels k = g3::llvm_kernels_with(key, "avx2", &fresh);
      std::string err = cap.finish();
      CHECK_FALSE(k.cached);
      CHECK(g3::llvm_compiles() == c0 + 1);
      CHECK(g3::llvm_cache_hits() == h0);
      CHECK(err.find("g3attn: warning: kernel cache entry") != std::string::npos);
      check_works(k);
      // The recompiled object replaced the damaged file.
      CHECK(g3test::read_bytes(files[0]) == good);
    }
  }
}

TEST_CASE("an unusable cache directory never fails a compile", "[jit_cache][llvm]") {
  g3test::TempDir d;
  g3test::write_text(d.file("plainfile"), "x");
  g3test::StderrCapture cap(d.file("stderr"));
  g3::JitCache c(d.file("plainfile") + "/sub");
  g3::BackendKernels k = g3::llvm_kernels_with(test_key(), "avx2", &c);
  std::string err = cap.finish();
  CHECK(err.find("running without a cache") != std::string::npos);
  check_works(k);
}

TEST_CASE("processes share the cache: one valid entry per key, found by the next process", "[jit_cache][llvm][cli]") {
  g3test::TempDir d;
  const std::string cache = d.file("cache");
  const std::string bin = g3test::g3attn_bin();
  const std::string env = "G3ATTN_CACHE_DIR='" + cache + "' ";
  const std::string cmd = env + "'" + bin + "' plan --backend llvm --model 1b --json";
  // Two cold processes at once into the same (not yet existing) directory.
  g3test::CmdResult r = g3test::run_shell("(" + cmd + " >'" + d.file("a.json") + "' & " + cmd + " >'" +
                                          d.file("b.json") + "' & wait)");
  REQUIRE(r.exit_code == 0);
  INFO(r.err);
  auto files = g3test::files_ending(cache, ".g3o");
  CHECK(files.size() == 2);  // 1b: one local and one global key
  CHECK(g3test::count_entries(cache) == 2);  // no temporaries left
  for (const auto& f : files) CHECK(g3test::read_bytes(f).size() > 1000);
  for (const char* n : {"a.json", "b.json"}) {
    auto j = nlohmann::json::parse(g3test::read_text(d.file(n)));
    for (const auto& l : j["layers"]) CHECK(l["backend"] == "llvm");
  }
  // A third process loads both kernels from the cache, without warnings.
  g3test::CmdResult r3 = g3test::run_shell(cmd);
  REQUIRE(r3.exit_code == 0);
  CHECK(r3.err.empty());
  auto j = nlohmann::json::parse(r3.out);
  for (const auto& l : j["layers"]) {
    CHECK(l["backend"] == "llvm");
    CHECK(l["cached"] == true);
  }
  if (j.contains("llvm")) {  // counters, once the CLI prints them
    CHECK(j["llvm"]["compiles"] == 0);
  }
  // And an unusable directory only costs a warning.
  g3test::write_text(d.file("plainfile"), "x");
  g3test::CmdResult r4 = g3test::run_shell("G3ATTN_CACHE_DIR='" + d.file("plainfile") + "/sub' '" + bin +
                                           "' plan --backend llvm --model 1b --json");
  CHECK(r4.exit_code == 0);
  CHECK(r4.err.find("g3attn: warning:") != std::string::npos);
}
