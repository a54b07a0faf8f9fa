// The on-disk kernel cache (generator/llvm/jit_cache.h) on its own: entries
// round-trip, damaged ones are refused with a warning, the directory comes
// from the environment, an unwritable directory means no cache. Under the
// LLVM backend (hits across cache objects and processes, corrupt entries
// recompiled, concurrent writers) it is tested in test_llvm, which exists
// only when the backend is built.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "generator/llvm/jit_cache.h"
#include "tests/support/test_support.h"

namespace fs = std::filesystem;

TEST_CASE("jit cache round-trips bytes and rejects damaged entries", "[jit_cache]") {
  g3test::TempDir d;
  g3::JitCache c(d.path);
  REQUIRE(c.can_read());
  std::vector<uint8_t> payload(1000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 7 + 3);
  CHECK_FALSE(c.load("id-a").has_value());  // miss, no warning needed
  REQUIRE(c.store("id-a", payload.data(), payload.size()));
  auto got = c.load("id-a");
  REQUIRE(got.has_value());
  CHECK(*got == payload);
  CHECK(g3test::files_ending(d.path, ".g3o").size() == 1);
  CHECK(g3test::count_entries(d.path) == 1);  // no temporary left behind

  std::vector<uint8_t> file = g3::JitCache::encode("id-a", payload.data(), payload.size());
  std::string why;
  CHECK(g3::JitCache::decode("id-a", file, &why).has_value());
  CHECK_FALSE(g3::JitCache::decode("id-b", file, &why).has_value());  // another identity
  std::vector<uint8_t> flipped = file;
  flipped[flipped.size() - 10] ^= 0x10;
  CHECK_FALSE(g3::JitCache::decode("id-a", flipped, &why).has_value());
  CHECK(why == "checksum mismatch");
  std::vector<uint8_t> cut(file.begin(), file.begin() + long(file.size() / 2));
  CHECK_FALSE(g3::JitCache::decode("id-a", cut, &why).has_value());
  CHECK_FALSE(g3::JitCache::decode("id-a", std::vector<uint8_t>(5, 1), &why).has_value());

  // A damaged file on disk: a warning and a miss, never an exception.
  g3test::write_bytes(c.entry_path("id-a"), cut);
  g3test::StderrCapture cap(d.path + "/../stderr_" + std::to_string(getpid()));
  CHECK_FALSE(c.load("id-a").has_value());
  std::string err = cap.finish();
  CHECK(err.find("g3attn: warning:") != std::string::npos);
  CHECK(err.find("invalid") != std::string::npos);
  fs::remove(cap.path);
}

TEST_CASE("jit cache directory from the environment", "[jit_cache]") {
  const char* old = std::getenv("G3ATTN_CACHE_DIR");
  std::string saved = old ? old : "";
  setenv("G3ATTN_CACHE_DIR", "/some/where", 1);
  CHECK(g3::default_jit_cache_dir() == "/some/where");
  unsetenv("G3ATTN_CACHE_DIR");
  setenv("XDG_CACHE_HOME", "/xdg", 1);
  CHECK(g3::default_jit_cache_dir() == "/xdg/g3attn");
  unsetenv("XDG_CACHE_HOME");
  if (std::getenv("HOME")) CHECK(g3::default_jit_cache_dir() == std::string(std::getenv("HOME")) + "/.cache/g3attn");
  if (old) setenv("G3ATTN_CACHE_DIR", saved.c_str(), 1);
}

TEST_CASE("an unwritable cache directory means no cache, with a warning", "[jit_cache]") {
  g3test::TempDir d;
  std::string dir;
  if (::geteuid() == 0) {
    // root writes through chmod 0555, so use a path below a regular file,
    // which can never be created.
    g3test::write_text(d.file("plainfile"), "x");
    dir = d.file("plainfile") + "/sub";
  } else {
    dir = d.file("ro");
    fs::create_directory(dir);
    fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                             fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  }
  g3test::StderrCapture cap(d.file("stderr"));
  g3::JitCache c(dir);
  uint8_t bytes[4] = {1, 2, 3, 4};
  CHECK_FALSE(c.store("id", bytes, 4));
  CHECK_FALSE(c.store("id", bytes, 4));
  std::string err = cap.finish();
  CHECK(err.find("g3attn: warning:") != std::string::npos);
  CHECK(err.find("without a cache") != std::string::npos);
  // One warning, not one per store.
  CHECK(err.find("g3attn: warning:") == err.rfind("g3attn: warning:"));
  if (::geteuid() != 0) fs::permissions(dir, fs::perms::owner_all);
}
