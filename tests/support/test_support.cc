#include "tests/support/test_support.h"

#include "generator/backend_api.h"
#include "runtime/dispatch/backends.h"
#include "runtime/dispatch/isa.h"
#include "runtime/exec/apply.h"
#include "runtime/io/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace fs = std::filesystem;

namespace g3test {

std::string g3attn_bin() { return G3ATTN_BIN; }
std::string source_dir() { return G3ATTN_SOURCE_DIR; }

namespace {

// How many cases each set holds: fewer means a half-copied or wrong
// directory, which must fail rather than quietly test less.
constexpr size_t kFullSetCases = 10, kSubsetCases = 3;

GoldenSet resolve_golden_set() {
  GoldenSet g;
  std::error_code ec;
  if (const char* env = std::getenv("G3ATTN_GOLDEN_DIR"); env && *env) {
    if (!fs::is_directory(env, ec))
      throw std::runtime_error(std::string("G3ATTN_GOLDEN_DIR=") + env + " is not a directory");
    g = {env, true, "$G3ATTN_GOLDEN_DIR"};
  } else if (fs::path beside = fs::path(source_dir()) / ".." / "shared" / "golden"; fs::is_directory(beside, ec)) {
    g = {fs::weakly_canonical(beside, ec).string(), true, "../shared/golden beside the project"};
  } else {
    g = {source_dir() + "/tests/golden", false, "in-repo subset"};
    if (!fs::is_directory(g.dir, ec)) throw std::runtime_error("the in-repo golden subset " + g.dir + " is missing");
  }
  std::printf("golden cases: %s from %s (%s)%s\n", g.full ? "full set" : "subset (3 tiny cases)", g.dir.c_str(),
              g.source.c_str(),
              g.full ? "" : "; set G3ATTN_GOLDEN_DIR or place ../shared/golden beside the project for the full set");
  std::fflush(stdout);
  return g;
}

}  // namespace

const GoldenSet& golden_set() {
  // Resolved once per process; a failure is rethrown on every call, so
  // each test that needs the cases fails with the same clear message.
  static std::optional<GoldenSet> set;
  static std::string error;
  if (!set && error.empty()) {
    try {
      set = resolve_golden_set();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!set) throw std::runtime_error(error);
  return *set;
}

std::string golden_dir() { return golden_set().dir; }

std::vector<std::string> golden_cases() {
  const GoldenSet& g = golden_set();
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(g.dir))
    if (e.is_directory() && fs::exists(e.path() / "config.json")) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  const size_t want = g.full ? kFullSetCases : kSubsetCases;
  if (out.size() < want)
    throw std::runtime_error("golden cases: " + g.dir + " (" + g.source + ") holds " + std::to_string(out.size()) +
                             " cases, expected at least " + std::to_string(want));
  return out;
}

std::string golden_file(const std::string& name, const std::string& file) {
  const GoldenSet& g = golden_set();
  const std::string p = g.dir + "/" + name + "/" + file;
  if (!fs::is_regular_file(p))
    throw std::runtime_error("golden file " + p + " is missing (" + (g.full ? "full set" : "subset") + " from " +
                             g.source + ")");
  return p;
}

bool need_golden_case(const std::string& name, const std::string& what) {
  const GoldenSet& g = golden_set();
  if (fs::exists(fs::path(g.dir) / name / "config.json")) return true;
  if (g.full) throw std::runtime_error("golden case " + name + " is missing from the full set at " + g.dir);
  std::printf("skipped: %s (needs golden case %s, only in the full set)\n", what.c_str(), name.c_str());
  std::fflush(stdout);
  return false;
}

TempDir::TempDir() {
  std::random_device rd;
  fs::path base = fs::path(G3ATTN_BINARY_DIR) / "test-scratch";
  fs::create_directories(base);
  for (int i = 0; i < 100; ++i) {
    fs::path p = base / ("t" + std::to_string(getpid()) + "_" + std::to_string(rd()));
    if (fs::create_directory(p)) {
      path = p.string();
      return;
    }
  }
  throw std::runtime_error("cannot create a scratch directory");
}
TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path, ec);
}

static std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

CmdResult run_shell(const std::string& command) {
  TempDir t;
  std::string full = command + " >" + quote(t.file("out")) + " 2>" + quote(t.file("err")) + " </dev/null";
  int status = std::system(full.c_str());
  CmdResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  r.out = read_text(t.file("out"));
  r.err = read_text(t.file("err"));
  return r;
}

CmdResult run_g3attn(const std::vector<std::string>& args, const std::string& env) {
  std::string cmd = env.empty() ? "" : env + " ";
  cmd += quote(g3attn_bin());
  for (const auto& a : args) cmd += " " + quote(a);
  return run_shell(cmd);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}
std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
std::vector<uint8_t> read_bytes(const std::string& path) {
  std::string s = read_text(path);
  return std::vector<uint8_t>(s.begin(), s.end());
}
void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
std::vector<uint8_t> safetensors_bytes(const std::string& header, const std::vector<uint8_t>& data) {
  // Sized once and filled, not grown by insert: g++ 12 flagged the growth
  // of a vector of 8 bytes (-Warray-bounds, a false positive) where callers
  // built these bytes themselves.
  std::vector<uint8_t> b(8 + header.size() + data.size());
  const uint64_t n = header.size();
  for (size_t i = 0; i < 8; ++i) b[i] = uint8_t(n >> (8 * i));
  std::copy(header.begin(), header.end(), b.begin() + 8);
  std::copy(data.begin(), data.end(), b.begin() + 8 + std::ptrdiff_t(header.size()));
  return b;
}
std::string read_from_fifo(const std::string& path, const std::string& data, size_t extra,
                           const std::function<void()>& read) {
  if (mkfifo(path.c_str(), 0600) != 0 && errno != EEXIST) throw std::runtime_error("cannot make the FIFO " + path);
  std::signal(SIGPIPE, SIG_IGN);
  std::thread writer([&] {
    const int fd = ::open(path.c_str(), O_WRONLY);  // returns once the reader has opened its end
    if (fd < 0) return;
    ssize_t put = ::write(fd, data.data(), data.size());
    const std::vector<char> zeros(size_t{1} << 16, 0);
    for (size_t left = extra; put >= 0 && left > 0;) {
      put = ::write(fd, zeros.data(), std::min(left, zeros.size()));
      if (put > 0) left -= size_t(put);
    }
    ::close(fd);
  });
  std::string error;
  try {
    read();
  } catch (const std::exception& e) {
    error = e.what();
  }
  writer.join();
  return error;
}

bool file_exists(const std::string& path) { return fs::exists(path); }
int count_entries(const std::string& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

std::vector<std::string> files_ending(const std::string& dir, const std::string& suffix) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename();
    if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      v.push_back(e.path().string());
  }
  return v;
}

StderrCapture::StderrCapture(const std::string& p) : path(p) {
  std::fflush(stderr);
  saved_ = ::dup(2);
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot open " + p + " to capture stderr");
  ::dup2(fd, 2);
  ::close(fd);
}
StderrCapture::~StderrCapture() { restore(); }
std::string StderrCapture::finish() {
  restore();
  return read_text(path);
}
void StderrCapture::restore() {
  std::fflush(stderr);
  if (saved_ >= 0) {
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
}

double max_abs_diff(const float* a, const float* b, int64_t rows, int64_t width,
                    const std::vector<bool>& row_ok, double atol, double rtol, int64_t* bad) {
  double mx = 0;
  int64_t nbad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (!row_ok.empty() && !row_ok[r]) continue;
    for (int64_t i = 0; i < width; ++i) {
      double x = a[r * width + i], y = b[r * width + i];
      double d = std::fabs(x - y);
      if (!(d <= atol + rtol * std::fabs(y))) ++nbad;  // NaN counts as bad
      if (d > mx || std::isnan(d)) mx = std::isnan(d) ? INFINITY : d;
    }
  }
  if (bad) *bad = nbad;
  return mx;
}

g3::ModelConfig tiny_model(std::vector<g3::LayerKind> kinds, int window) {
  g3::ModelConfig m;
  m.name = "tiny";
  m.hidden_size = 64;
  m.num_layers = int(kinds.size());
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 16;
  m.sliding_window = window;
  m.query_pre_attn_scalar = 16;
  m.rope_global_scale = 8;
  m.layer_types = kinds;
  m.max_position_embeddings = 1 << 20;
  return m;
}

g3::WeightSource random_weights(uint64_t seed) {
  return [seed](const g3::LayerSpec& s) { return g3::random_layer_weights(s, seed, g3::DType::BF16); };
}

std::vector<float> randn(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

g3::ApplyRequest golden_apply_request(const std::string& name) {
  g3::ApplyRequest r;
  r.config = golden_file(name, "config.json");
  r.weights = golden_file(name, "weights.safetensors");
  r.input = golden_file(name, "x.npy");
  r.positions = golden_file(name, "positions.npy");
  // Some cases of the full set have no mask (every token real).
  const std::string mask = golden_dir() + "/" + name + "/attention_mask.npy";
  if (file_exists(mask)) r.attention_mask = mask;
  return r;
}

GoldenCheck check_golden_case(const std::string& name, const std::string& backend, const std::string& isa) {
  g3::ApplyRequest r = golden_apply_request(name);
  r.backend = backend;
  r.isa = isa;
  const std::string attn_path = golden_file(name, "attn_out.npy"), block_path = golden_file(name, "block_out.npy");
  g3::ApplyResult res = g3::run_apply(r);
  g3::NpyArray want_attn = g3::read_npy_f32(attn_path);
  g3::NpyArray want_block = g3::read_npy_f32(block_path);
  g3::NpyArray pos = g3::read_npy_i32(r.positions);
  int32_t mx = 0;
  for (int32_t p : pos.i32) mx = std::max(mx, p);
  const double f = mx >= 100000 ? 10.0 : 1.0;
  const int64_t rows = res.B * res.T, D = res.spec.hidden_size;
  if (want_attn.size() != rows * D || want_block.size() != rows * D)
    throw std::runtime_error(name + ": golden outputs do not match the input's shape");
  GoldenCheck g;
  g.backend = res.backend;
  g.isa = res.isa;
  g.attn_max = max_abs_diff(res.attn_out.data(), want_attn.f32.data(), rows, D, res.real_row, 1e-4 * f, 1e-4 * f,
                            &g.bad_attn);
  g.block_max = max_abs_diff(res.block_out.data(), want_block.f32.data(), rows, D, res.real_row, 5e-4 * f, 1e-4 * f,
                             &g.bad_block);
  std::printf("golden %-36s %-9s %-7s attn_out max|diff| %.3g  block_out max|diff| %.3g\n", name.c_str(),
              g.backend.c_str(), g.isa.c_str(), g.attn_max, g.block_max);
  return g;
}

std::vector<std::string> highway_test_isas() {
  std::vector<std::string> v;
  const std::vector<std::string> compiled = g3::highway_compiled_isas();
  for (const auto& isa : g3::isa_names()) {
    if (std::find(compiled.begin(), compiled.end(), isa) == compiled.end())
      std::printf("skipped: highway %s (not compiled into this build)\n", isa.c_str());
    else if (!g3::isa_supported_by_cpu(isa))
      std::printf("skipped: highway %s (this CPU cannot run it)\n", isa.c_str());
    else
      v.push_back(isa);
  }
  std::fflush(stdout);
  return v;
}

bool backend_runs_here(const std::string& backend, const std::string& isa_in, Through via) {
  const std::string isa = isa_in.empty() || isa_in == "best" ? g3::best_isa() : isa_in;
  // A key every backend serves when it serves the ISA at all (head_dim 64,
  // a multiple of every vector width), to ask the table about the ISA alone.
  const g3::KernelKey probe{.head_dim = 64, .group = 2, .rope_base = 10000, .alpha = 0.125f};
  const g3::Backend* b = g3::find_backend(backend);
  std::string why;
  if (!b) {
    why = "not a backend of this build's table";
  } else if (!g3::isa_supported_by_cpu(isa)) {
    why = "this CPU cannot run " + isa;
  } else if ((via == Through::Runtime || b->kind == g3::BackendKind::Aot) && !g3::isa_compiled(isa)) {
    // --isa accepts only Highway's compiled targets, and Highway serves the
    // stages a JIT leaves out, so through the runtime a cap Highway lacks
    // cannot run any backend (the sanitizer build compiles AVX2 and scalar
    // only); Highway's own kernels exist only for its compiled targets.
    why = isa + " is not compiled into this build";
  } else if (via == Through::Runtime || !b->in_build) {
    why = b->why_unavailable(probe, isa);  // not in this build, an ISA cap below what the JIT emits, ...
  }
  if (why.empty()) return true;
  std::printf("skipped: %s %s (%s)\n", backend.c_str(), isa.c_str(), why.c_str());
  std::fflush(stdout);
  return false;
}

ScratchJitCache::ScratchJitCache() { setenv("G3ATTN_CACHE_DIR", dir.path.c_str(), 1); }

}  // namespace g3test
