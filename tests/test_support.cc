#include "test_support.h"

#include "apply.h"
#include "npy.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace g3test {

std::string golden_dir() { return G3ATTN_GOLDEN_DIR; }
std::string g3attn_bin() { return G3ATTN_BIN; }
std::string source_dir() { return G3ATTN_SOURCE_DIR; }

std::vector<std::string> golden_cases() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(golden_dir()))
    if (e.is_directory() && fs::exists(e.path() / "config.json")) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
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
bool file_exists(const std::string& path) { return fs::exists(path); }
int count_entries(const std::string& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
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

GoldenCheck check_golden_case(const std::string& name, const std::string& backend, const std::string& isa) {
  std::string d = golden_dir() + "/" + name;
  g3::ApplyRequest r;
  r.config = d + "/config.json";
  r.weights = d + "/weights.safetensors";
  r.input = d + "/x.npy";
  r.positions = d + "/positions.npy";
  if (file_exists(d + "/attention_mask.npy")) r.attention_mask = d + "/attention_mask.npy";
  r.backend = backend;
  r.isa = isa;
  g3::ApplyResult res = g3::run_apply(r);
  g3::NpyArray want_attn = g3::read_npy_f32(d + "/attn_out.npy");
  g3::NpyArray want_block = g3::read_npy_f32(d + "/block_out.npy");
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

}  // namespace g3test
