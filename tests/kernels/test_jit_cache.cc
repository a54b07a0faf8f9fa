// The on-disk kernel cache (runtime/jit_cache.h) on its own and under the
// LLVM backend: hits across cache objects and processes, corrupt entries
// detected and recompiled with a warning, unwritable directories tolerated,
// concurrent writers leaving one valid entry.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "generator/kernel_key.h"
#include "generator/llvm/jit_cache.h"
#include "runtime/reference/reference.h"
#include "tests/support/test_support.h"
#ifdef G3_LLVM_AVAILABLE
#include "generator/llvm/llvm_backend.h"
#endif

namespace fs = std::filesystem;

namespace {

// Redirects this process's stderr to a file while alive, so warnings can be
// checked.
struct StderrCapture {
  std::string path;
  int saved = -1;
  explicit StderrCapture(const std::string& p) : path(p) {
    std::fflush(stderr);
    saved = ::dup(2);
    int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 2);
    ::close(fd);
  }
  // Restores stderr and returns what was captured.
  std::string finish() {
    restore();
    return g3test::read_text(path);
  }
  // Only restores: the test may have read and removed the file already, and
  // a destructor must not throw (read_text does for a missing file).
  ~StderrCapture() { restore(); }

 private:
  void restore() {
    std::fflush(stderr);
    if (saved >= 0) {
      ::dup2(saved, 2);
      ::close(saved);
      saved = -1;
    }
  }
};

std::vector<std::string> entries(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename();
    if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      v.push_back(e.path().string());
  }
  return v;
}

}  // namespace

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
  CHECK(entries(d.path, ".g3o").size() == 1);
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
  StderrCapture cap(d.path + "/../stderr_" + std::to_string(getpid()));
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
  StderrCapture cap(d.file("stderr"));
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

#ifdef G3_LLVM_AVAILABLE

namespace {

g3::KernelKey test_key() {
  g3::KernelKey k;
  k.head_dim = 64;
  k.group = 2;
  k.window = 13;
  k.rope_base = 1e4;
  k.rope_scale = 1;
  k.alpha = 0.125f;
  k.kv_dtype = g3::DType::F32;
  return k;
}

// A small core call checked against the reference: the object that came
// back (compiled or from the cache) really works.
void check_works(const g3::BackendKernels& k) {
  const int dh = 64, G = 2;
  const int64_t T = 3, S = 20;
  std::vector<float> q(size_t(T * G * dh)), kc(size_t(S * dh)), vc(size_t(S * dh));
  for (size_t i = 0; i < q.size(); ++i) q[i] = float((i * 37) % 11) * 0.05f - 0.2f;
  for (size_t i = 0; i < kc.size(); ++i) kc[i] = float((i * 13) % 17) * 0.1f - 0.8f;
  for (size_t i = 0; i < vc.size(); ++i) vc[i] = float((i * 7) % 5) - 2.f;
  std::vector<int32_t> qpos = {5, 12, 19}, kpos(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) kpos[s] = int32_t(s);
  std::vector<uint8_t> valid(static_cast<size_t>(S), 1);
  std::vector<float> o1(q.size()), o2(q.size());
  g3_core_args a{};
  a.T = T;
  a.q = q.data();
  a.q_stride = G * dh;
  a.qpos = qpos.data();
  a.k = kc.data();
  a.v = vc.data();
  a.S = S;
  a.kpos = kpos.data();
  a.kvalid = valid.data();
  a.out_stride = G * dh;
  a.head_dim = dh;
  a.group = G;
  a.window = 13;
  a.kv_dtype = G3_DTYPE_F32;
  a.out = o1.data();
  k.table.core(&a);
  a.out = o2.data();
  g3::ref::core(&a);
  int64_t bad = 0;
  double d = g3test::max_abs_diff(o1.data(), o2.data(), T, G * dh, {}, 2e-5, 2e-5, &bad);
  INFO("max diff " << d);
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
  CHECK(entries(d.path, ".g3o").size() == 1);
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
  CHECK(entries(d.path, ".g3o").size() == 2);
}

TEST_CASE("a corrupt cache entry is recompiled with a warning", "[jit_cache][llvm]") {
  g3::KernelKey key = test_key();
  for (const std::string damage : {"truncate", "garbage", "bitflip"}) {
    SECTION(damage) {
      g3test::TempDir d;
      g3::JitCache c(d.path);
      g3::llvm_kernels_with(key, "avx2", &c);
      auto files = entries(d.path, ".g3o");
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
      StderrCapture cap(logdir.file("stderr"));
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
  StderrCapture cap(d.file("stderr"));
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
  auto files = entries(cache, ".g3o");
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

#endif  // G3_LLVM_AVAILABLE
