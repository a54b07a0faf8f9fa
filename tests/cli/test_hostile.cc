// Hostile inputs across the g3attn commands. Every case
// starts from a writable copy of a golden case (or a built-in model), breaks
// one thing, runs the real command and checks the promise of the CLI:
// exit code 2, exactly one line on stderr, and no output file left behind.
// Inputs that are legal but extreme (NaN, Inf, huge positions, negative
// positions on padding) must finish with exit 0 and show what they do; each
// such case says in its comment what the command does with the input.
//
// Every command runs under `timeout 300`, a hang guard only (so a hang fails
// the test instead of stalling the suite; no test asserts how fast anything
// is), and (outside sanitizer builds, whose shadow memory
// needs a huge address space) under a 4 GiB address-space limit, so a
// dimension that would need absurd memory fails with bad_alloc (exit 2 with
// "out of memory", which these tests reject) or a crash rather than by luck.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/io/npy.h"
#include "tests/support/test_support.h"

namespace fs = std::filesystem;
using g3test::CmdResult;
using nlohmann::json;

namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

const char* kCase = "tiny_local_L0_T12_B2_rightpad";  // D64, 4 heads, 2 KV heads, dh16, W4, B2 x T12

// Prefix of every command: a hang limit, an address-space limit and a JIT
// cache of the test's own (so no test writes into the user's cache).
std::string guard(const std::string& cache_dir) {
  std::string p = kSanitized ? "" : "ulimit -v 4194304; ";
  return p + "G3ATTN_CACHE_DIR='" + cache_dir + "' timeout 300";
}

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  if (!s.empty() && s.back() != '\n') ++n;
  return n;
}

// The CLI's promise for bad input.
void expect_rejected(const CmdResult& r, const std::string& out_dir, const std::string& expect_in_message = "") {
  INFO("exit " << r.exit_code << "\nstderr: " << r.err << "\nstdout: " << r.out.substr(0, 400));
  CHECK(r.exit_code == 2);
  CHECK(lines(r.err) == 1);
  CHECK(r.err.rfind("g3attn", 0) == 0);
  // bad_alloc is mapped to exit 2 too, but a dimension check must come first.
  CHECK(r.err.find("out of memory") == std::string::npos);
  CHECK(r.err.find("internal error") == std::string::npos);
  if (!expect_in_message.empty()) CHECK(r.err.find(expect_in_message) != std::string::npos);
  if (!out_dir.empty()) CHECK(g3test::count_entries(out_dir) == 0);
}

// ---- editing copies of the golden files --------------------------------------

struct SafeTensorsBytes {
  json header;
  std::vector<uint8_t> data;  // the data section
};

SafeTensorsBytes read_safetensors(const std::string& path) {
  std::vector<uint8_t> b = g3test::read_bytes(path);
  REQUIRE(b.size() >= 8);
  uint64_t n;
  std::memcpy(&n, b.data(), 8);
  REQUIRE(n <= b.size() - 8);
  SafeTensorsBytes s;
  s.header = json::parse(b.begin() + 8, b.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  s.data.assign(b.begin() + 8 + static_cast<std::ptrdiff_t>(n), b.end());
  return s;
}

void write_safetensors(const std::string& path, const SafeTensorsBytes& s) {
  g3test::write_bytes(path, g3test::safetensors_bytes(s.header.dump(), s.data));
}

// Byte offset of element `i` of tensor `name` in the data section.
size_t element_offset(const SafeTensorsBytes& s, const std::string& name, size_t i) {
  const json& t = s.header.at(name);
  size_t esize = t.at("dtype") == "F32" ? 4 : 2;
  return t.at("data_offsets")[0].get<size_t>() + i * esize;
}

void set_element(SafeTensorsBytes& s, const std::string& name, size_t i, float v) {
  size_t off = element_offset(s, name, i);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  if (s.header.at(name).at("dtype") == "F32") {
    std::memcpy(&s.data[off], &bits, 4);
  } else {
    REQUIRE(s.header.at(name).at("dtype") == "BF16");
    uint16_t hi = static_cast<uint16_t>(bits >> 16);  // NaN and Inf survive truncation to bf16
    std::memcpy(&s.data[off], &hi, 2);
  }
}

void write_npy_f32(const std::string& path, const std::vector<float>& v, const std::vector<int64_t>& shape) {
  g3test::write_bytes(path, g3::npy_bytes_f32(v.data(), shape));
}
void write_npy_i32(const std::string& path, const std::vector<int32_t>& v, const std::vector<int64_t>& shape) {
  g3test::write_bytes(path, g3::npy_bytes_i32(v.data(), shape));
}

// A .npy file with an arbitrary header (dtype, shape) and raw payload.
void write_npy_raw(const std::string& path, const std::string& descr, const std::string& shape,
                   const std::vector<uint8_t>& payload) {
  std::string h = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  h.append((64 - (10 + h.size() + 1) % 64) % 64, ' ');
  h += '\n';
  // Sized once and filled (like g3test::safetensors_bytes): g++ 12 flagged
  // growing the 10-byte prefix by insert (-Warray-bounds, a false positive).
  const uint8_t prefix[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(h.size() & 0xff),
                              static_cast<uint8_t>(h.size() >> 8)};
  std::vector<uint8_t> b(10 + h.size() + payload.size());
  std::copy(prefix, prefix + 10, b.begin());
  std::copy(h.begin(), h.end(), b.begin() + 10);
  std::copy(payload.begin(), payload.end(), b.begin() + 10 + std::ptrdiff_t(h.size()));
  g3test::write_bytes(path, b);
}

// Header size of a version 1.0 .npy file (magic, version, length, header).
size_t npy_header_bytes(const std::vector<uint8_t>& b) { return 10 + (b[8] | (b[9] << 8)); }

// A writable copy of one golden case's inputs plus an empty output directory.
struct ApplyCase {
  g3test::TempDir in, out, cache;
  std::string mask;  // "" when the case has no attention mask
  explicit ApplyCase(const std::string& name = kCase) {
    // The four required files must exist (golden_file fails the test with
    // the path otherwise); the mask is optional.
    for (const char* f : {"config.json", "weights.safetensors", "x.npy", "positions.npy"})
      fs::copy_file(g3test::golden_file(name, f), in.file(f));
    const std::string d = g3test::golden_dir() + "/" + name;
    if (g3test::file_exists(d + "/attention_mask.npy")) fs::copy_file(d + "/attention_mask.npy", in.file("attention_mask.npy"));
    if (g3test::file_exists(in.file("attention_mask.npy"))) mask = in.file("attention_mask.npy");
  }
  std::string cfg() const { return in.file("config.json"); }
  std::string weights() const { return in.file("weights.safetensors"); }
  std::string x() const { return in.file("x.npy"); }
  std::string pos() const { return in.file("positions.npy"); }
  std::string block_out() const { return out.file("block.npy"); }
  std::string attn_out() const { return out.file("attn.npy"); }

  std::vector<std::string> args(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> a = {"apply", "--config", cfg(), "--weights", weights(), "--input", x(),
                                  "--positions", pos(), "--out", block_out(), "--attn-out", attn_out()};
    if (!mask.empty()) {
      a.push_back("--attention-mask");
      a.push_back(mask);
    }
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  CmdResult run(const std::vector<std::string>& extra = {}) const {
    return g3test::run_g3attn(args(extra), guard(cache.path));
  }
  // Runs and checks the rejection, and that nothing appeared beside the inputs.
  void rejected(const std::vector<std::string>& extra = {}, const std::string& msg = "") const {
    int before = g3test::count_entries(in.path);
    CmdResult r = run(extra);
    expect_rejected(r, out.path, msg);
    CHECK(g3test::count_entries(in.path) == before);
  }

  json config() const { return json::parse(g3test::read_text(cfg())); }
  void set_config(const json& j) const { g3test::write_text(cfg(), j.dump(1)); }
  g3::NpyArray input() const { return g3::read_npy_f32(x()); }
};

// Rows (of D floats) of an output that hold a non-finite value.
std::vector<bool> nonfinite_rows(const g3::NpyArray& a) {
  const int64_t D = a.shape.back(), rows = a.size() / D;
  std::vector<bool> r(static_cast<size_t>(rows), false);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t d = 0; d < D; ++d)
      if (!std::isfinite(a.f32[static_cast<size_t>(i * D + d)])) r[static_cast<size_t>(i)] = true;
  return r;
}

std::vector<int32_t> mask_of(const ApplyCase& c) { return g3::read_npy_i32(c.mask).i32; }

const std::vector<std::string> kBackends = {"reference", "auto"};

// NaN or Inf in element 0 of a weight tensor: rejected at load on every
// backend (README: non-finite weights are refused; non-finite inputs
// propagate), with one line naming the tensor and nothing written.
void check_weight_nonfinite_rejected(const std::string& backend) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct W {
    const char* what;
    const char* tensor;
    float value;
  };
  for (W w : {W{"NaN in q_norm", "model.layers.0.self_attn.q_norm.weight", nan},
              W{"NaN in k_proj", "model.layers.0.self_attn.k_proj.weight", nan},
              W{"+Inf in v_proj", "model.layers.0.self_attn.v_proj.weight", inf},
              W{"NaN in o_proj", "model.layers.0.self_attn.o_proj.weight", nan},
              W{"NaN in input_layernorm", "model.layers.0.input_layernorm.weight", nan},
              W{"-Inf in post_attention_layernorm", "model.layers.0.post_attention_layernorm.weight", -inf}}) {
    ApplyCase c;
    SafeTensorsBytes s = read_safetensors(c.weights());
    set_element(s, w.tensor, 0, w.value);
    write_safetensors(c.weights(), s);
    CmdResult r = c.run({"--backend", backend});
    INFO(w.what << ", backend " << backend);
    expect_rejected(r, c.out.path, "non-finite");
    CHECK(r.err.find(w.tensor) != std::string::npos);
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// apply
// ---------------------------------------------------------------------------

TEST_CASE("hostile apply: the unmodified copy runs (so the rejections below are not vacuous)", "[hostile][apply]") {
  ApplyCase c;
  for (const auto& b : kBackends) {
    CmdResult r = c.run({"--backend", b});
    INFO(b << ": " << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(g3test::file_exists(c.block_out()));
    CHECK(g3test::file_exists(c.attn_out()));
    fs::remove(c.block_out());
    fs::remove(c.attn_out());
  }
}

TEST_CASE("hostile apply: dimensions that would need absurd memory are rejected before allocating",
          "[hostile][apply][memory]") {
  struct Dim {
    const char* field;
    int64_t value;
  };
  for (Dim d : {Dim{"head_dim", int64_t{1} << 30}, Dim{"hidden_size", 1000000000}, Dim{"num_attention_heads", 1 << 30},
                Dim{"num_key_value_heads", 1 << 30}, Dim{"sliding_window", int64_t{1} << 40},
                Dim{"max_position_embeddings", int64_t{1} << 40}, Dim{"hidden_size", int64_t{1} << 62}}) {
    SECTION(std::string(d.field) + " = " + std::to_string(d.value)) {
      ApplyCase c;
      json j = c.config();
      j[d.field] = d.value;
      c.set_config(j);
      c.rejected();
    }
  }
  SECTION("num_hidden_layers = 10^9 without layer_types") {
    ApplyCase c;
    json j = c.config();
    j.erase("layer_types");
    j["num_hidden_layers"] = 1000000000;
    c.set_config(j);
    c.rejected();
  }
  SECTION("num_hidden_layers = 10^9 with a short layer_types") {
    ApplyCase c;
    json j = c.config();
    j["num_hidden_layers"] = 1000000000;
    c.set_config(j);
    c.rejected();
  }
  SECTION("--layer 10^9") {
    ApplyCase c;
    c.rejected({"--layer", "1000000000"});
  }
  SECTION("x.npy header claims [2^20, 2^20, 64] without the data") {
    ApplyCase c;
    write_npy_raw(c.x(), "<f4", "(1048576, 1048576, 64)", {});
    c.rejected();
  }
  SECTION("x.npy header claims 2^62 elements") {
    ApplyCase c;
    write_npy_raw(c.x(), "<f4", "(4611686018427387904,)", {});
    c.rejected();
  }
  SECTION("weights header claims a [2^31, 2^31] tensor") {
    ApplyCase c;
    SafeTensorsBytes s = read_safetensors(c.weights());
    s.header["model.layers.0.self_attn.q_proj.weight"]["shape"] = {int64_t{1} << 31, int64_t{1} << 31};
    write_safetensors(c.weights(), s);
    c.rejected();
  }
  SECTION("weights header length field 2^63") {
    ApplyCase c;
    std::vector<uint8_t> b = g3test::read_bytes(c.weights());
    uint64_t n = uint64_t{1} << 63;
    std::memcpy(b.data(), &n, 8);
    g3test::write_bytes(c.weights(), b);
    c.rejected();
  }
}

TEST_CASE("hostile apply: a config that contradicts the weights or inputs", "[hostile][apply]") {
  struct Edit {
    const char* what;
    const char* field;
    int value;
  };
  // Each keeps the config valid on its own; only the weights disagree.
  for (Edit e : {Edit{"more query heads than q_proj has", "num_attention_heads", 8},
                 Edit{"more KV heads than k_proj has", "num_key_value_heads", 4},
                 Edit{"a larger head_dim", "head_dim", 32}, Edit{"a smaller head_dim", "head_dim", 8},
                 Edit{"a larger hidden_size (x.npy is [2,12,64])", "hidden_size", 128}}) {
    SECTION(e.what) {
      ApplyCase c;
      json j = c.config();
      j[e.field] = e.value;
      c.set_config(j);
      c.rejected();
    }
  }
  SECTION("hidden_size 128 with a matching x.npy, weights still D=64") {
    ApplyCase c;
    json j = c.config();
    j["hidden_size"] = 128;
    c.set_config(j);
    write_npy_f32(c.x(), std::vector<float>(2 * 12 * 128, 0.5f), {2, 12, 128});
    c.rejected();
  }
  SECTION("weights transposed shape for q_proj (same bytes)") {
    ApplyCase c;
    SafeTensorsBytes s = read_safetensors(c.weights());
    auto& sh = s.header["model.layers.0.self_attn.q_proj.weight"]["shape"];
    sh = {sh[1], sh[0], 1};
    write_safetensors(c.weights(), s);
    c.rejected();
  }
  SECTION("a tensor of the layer is missing") {
    ApplyCase c;
    SafeTensorsBytes s = read_safetensors(c.weights());
    const std::string k = "model.layers.0.self_attn.k_norm.weight";
    s.header["model.layers.0.self_attn.k_norm_typo.weight"] = s.header[k];
    s.header.erase(k);
    write_safetensors(c.weights(), s);
    c.rejected({}, "k_norm");
  }
  SECTION("the weights hold another layer") {
    ApplyCase c;
    c.rejected({"--layer", "3"});
  }
  SECTION("a weight tensor of an unsupported dtype (I32 or I16)") {
    ApplyCase c;
    SafeTensorsBytes s = read_safetensors(c.weights());
    auto& t = s.header["model.layers.0.self_attn.k_norm.weight"];
    // Same element size, so only the dtype check can reject it.
    t["dtype"] = t["dtype"] == "F32" ? "I32" : "I16";
    write_safetensors(c.weights(), s);
    c.rejected();
  }
  SECTION("positions.npy of another shape") {
    ApplyCase c;
    write_npy_i32(c.pos(), std::vector<int32_t>(12, 0), {1, 12});
    c.rejected();
  }
  SECTION("x.npy of rank 2") {
    ApplyCase c;
    write_npy_f32(c.x(), std::vector<float>(24 * 64, 0.5f), {24, 64});
    c.rejected();
  }
  SECTION("x.npy with an empty batch") {
    ApplyCase c;
    write_npy_f32(c.x(), {}, {0, 12, 64});
    write_npy_i32(c.pos(), {}, {0, 12});
    c.mask.clear();
    c.rejected();
  }
}

// Cuts a file to the length `keep` picks from its bytes.
template <class Keep>
void cut_file(const std::string& path, Keep keep) {
  std::vector<uint8_t> b = g3test::read_bytes(path);
  b.resize(keep(b));
  g3test::write_bytes(path, b);
}

// The length of a safetensors file's 8-byte size field plus its JSON header.
size_t safetensors_header_bytes(const std::vector<uint8_t>& b) {
  uint64_t n;
  std::memcpy(&n, b.data(), 8);
  return 8 + n;
}

TEST_CASE("hostile apply: files truncated after the header", "[hostile][apply][truncated]") {
  ApplyCase c;
  SECTION("x.npy cut right after its header") {
    cut_file(c.x(), npy_header_bytes);
    c.rejected({}, "truncated");
  }
  SECTION("x.npy cut in the middle of the data") {
    cut_file(c.x(), [](const std::vector<uint8_t>& b) { return b.size() - 1001; });
    c.rejected({}, "truncated");
  }
  SECTION("x.npy cut inside its header") {
    cut_file(c.x(), [](const std::vector<uint8_t>&) { return size_t{40}; });
    c.rejected();
  }
  SECTION("positions.npy cut right after its header") {
    cut_file(c.pos(), npy_header_bytes);
    c.rejected();
  }
  SECTION("attention_mask.npy cut right after its header") {
    REQUIRE(!c.mask.empty());
    cut_file(c.mask, npy_header_bytes);
    c.rejected();
  }
  SECTION("weights.safetensors cut right after its JSON header") {
    cut_file(c.weights(), safetensors_header_bytes);
    c.rejected();
  }
  SECTION("weights.safetensors cut one byte short") {
    cut_file(c.weights(), [](const std::vector<uint8_t>& b) { return b.size() - 1; });
    c.rejected();
  }
  SECTION("weights.safetensors cut inside its JSON header") {
    cut_file(c.weights(), [](const std::vector<uint8_t>&) { return size_t{100}; });
    c.rejected();
  }
  SECTION("weights.safetensors of 5 bytes") {
    cut_file(c.weights(), [](const std::vector<uint8_t>&) { return size_t{5}; });
    c.rejected();
  }
  SECTION("empty weights file") {
    g3test::write_bytes(c.weights(), {});
    c.rejected();
  }
  SECTION("config.json cut in half") {
    std::string t = g3test::read_text(c.cfg());
    g3test::write_text(c.cfg(), t.substr(0, t.size() / 2));
    c.rejected();
  }
}

TEST_CASE("hostile apply: positions", "[hostile][apply][positions]") {
  SECTION("int64 positions.npy holding 2^31 (dtype error)") {
    ApplyCase c;
    std::vector<uint8_t> payload(2 * 12 * 8, 0);
    for (int i = 0; i < 24; ++i) {
      int64_t v = (int64_t{1} << 31) + i;
      std::memcpy(&payload[static_cast<size_t>(i) * 8], &v, 8);
    }
    write_npy_raw(c.pos(), "<i8", "(2, 12)", payload);
    c.rejected({}, "int32");
  }
  SECTION("float32 positions.npy") {
    ApplyCase c;
    write_npy_f32(c.pos(), std::vector<float>(24, 1.0f), {2, 12});
    c.rejected();
  }
  SECTION("a negative position on a real token") {
    ApplyCase c;
    g3::NpyArray p = g3::read_npy_i32(c.pos());
    p.i32[3] = -5;  // batch 0, token 3 is real in this case
    REQUIRE(mask_of(c)[3] == 1);
    write_npy_i32(c.pos(), p.i32, p.shape);
    c.rejected({}, "negative");
  }
  SECTION("INT32_MIN on a real token") {
    ApplyCase c;
    g3::NpyArray p = g3::read_npy_i32(c.pos());
    p.i32[0] = std::numeric_limits<int32_t>::min();
    write_npy_i32(c.pos(), p.i32, p.shape);
    c.rejected({}, "negative");
  }
  SECTION("a negative position on a padded slot is accepted (README: it means nothing)") {
    ApplyCase c;
    g3::NpyArray p = g3::read_npy_i32(c.pos());
    std::vector<int32_t> m = mask_of(c);
    int pad = -1;
    for (size_t i = 0; i < m.size(); ++i)
      if (m[i] == 0) pad = static_cast<int>(i);
    REQUIRE(pad >= 0);
    p.i32[static_cast<size_t>(pad)] = std::numeric_limits<int32_t>::min();
    write_npy_i32(c.pos(), p.i32, p.shape);
    for (const auto& b : kBackends) {
      CmdResult r = c.run({"--backend", b});
      INFO(b << ": " << r.err);
      CHECK(r.exit_code == 0);
    }
  }
  SECTION("positions near INT32_MAX on real tokens run and stay finite") {
    // Beyond max_position_embeddings, but RoPE is defined for any position,
    // so the command accepts it, as README's apply section promises.
    ApplyCase c;
    g3::NpyArray p = g3::read_npy_i32(c.pos());
    for (size_t i = 0; i < p.i32.size(); ++i) p.i32[i] = std::numeric_limits<int32_t>::max() - 20 + static_cast<int32_t>(i % 12);
    write_npy_i32(c.pos(), p.i32, p.shape);
    std::vector<int32_t> m = mask_of(c);
    for (const auto& b : kBackends) {
      CmdResult r = c.run({"--backend", b});
      INFO(b << ": " << r.err);
      REQUIRE(r.exit_code == 0);
      std::vector<bool> bad = nonfinite_rows(g3::read_npy_f32(c.block_out()));
      for (size_t i = 0; i < bad.size(); ++i)
        if (m[i]) CHECK_FALSE(bad[i]);
      fs::remove(c.block_out());
      fs::remove(c.attn_out());
    }
  }
}

TEST_CASE("hostile apply: attention masks that are not 0/1", "[hostile][apply][mask]") {
  for (int v : {2, -1, 255, std::numeric_limits<int32_t>::min()}) {
    SECTION("mask value " + std::to_string(v)) {
      ApplyCase c;
      std::vector<int32_t> m = mask_of(c);
      m[5] = v;
      write_npy_i32(c.mask, m, {2, 12});
      c.rejected({}, "0 or 1");
    }
  }
  SECTION("float32 mask of 0.0/1.0") {
    ApplyCase c;
    std::vector<int32_t> m = mask_of(c);
    std::vector<float> f(m.begin(), m.end());
    write_npy_f32(c.mask, f, {2, 12});
    c.rejected();
  }
  SECTION("bool mask ('|b1')") {
    ApplyCase c;
    std::vector<uint8_t> payload(24, 1);
    write_npy_raw(c.mask, "|b1", "(2, 12)", payload);
    c.rejected();
  }
  SECTION("mask of shape [2, 11]") {
    ApplyCase c;
    write_npy_i32(c.mask, std::vector<int32_t>(22, 1), {2, 11});
    c.rejected();
  }
  SECTION("an all-zero mask is legal: every row is don't-care") {
    ApplyCase c;
    write_npy_i32(c.mask, std::vector<int32_t>(24, 0), {2, 12});
    for (const auto& b : kBackends) {
      CmdResult r = c.run({"--backend", b});
      INFO(b << ": " << r.err);
      CHECK(r.exit_code == 0);
    }
  }
}

TEST_CASE("hostile apply: NaN and Inf in x propagate, never hang", "[hostile][apply][nan]") {
  // apply --help promises propagation. Token t's residual x[t] is in its own
  // block output row, so that row must be non-finite. We also print which
  // other rows turned non-finite. Observed: every real row of that batch item,
  // earlier tokens included: a masked key still enters the weighted sum of
  // values with weight 0, and 0 x NaN = NaN (SPEC 1.3 step I sums over all S,
  // as the official einsum does). The other batch item stays finite.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct In {
    const char* what;
    float value;
  };
  for (In v : {In{"NaN", nan}, In{"+Inf", inf}, In{"-Inf", -inf}}) {
    SECTION(std::string(v.what) + " in x at batch 0, token 2") {
      ApplyCase c;
      g3::NpyArray x = c.input();
      x.f32[2 * 64 + 7] = v.value;
      write_npy_f32(c.x(), x.f32, x.shape);
      std::vector<int32_t> m = mask_of(c);
      for (const auto& b : kBackends) {
        CmdResult r = c.run({"--backend", b});
        INFO(b << ": " << r.err);
        REQUIRE(r.exit_code == 0);
        std::vector<bool> bad = nonfinite_rows(g3::read_npy_f32(c.block_out()));
        std::string rows;
        for (size_t i = 0; i < bad.size(); ++i)
          if (bad[i] && m[i]) rows += " " + std::to_string(i);
        std::printf("hostile: %s in x[0,2]: backend %s: non-finite real rows:%s\n", v.what, b.c_str(), rows.c_str());
        CHECK(bad[2]);
        for (size_t i = 12; i < bad.size(); ++i) CHECK_FALSE(bad[i]);  // batch 1 never sees batch 0
        fs::remove(c.block_out());
        fs::remove(c.attn_out());
      }
    }
  }
}

TEST_CASE("hostile apply: NaN and Inf in weights are rejected on every backend", "[hostile][apply][nan]") {
  for (const auto& b : kBackends) check_weight_nonfinite_rejected(b);
}

TEST_CASE("hostile apply: output paths that cannot be written", "[hostile][apply][output]") {
  SECTION("--out in a directory that does not exist") {
    ApplyCase c;
    std::vector<std::string> a = c.args();
    for (size_t i = 0; i + 1 < a.size(); ++i)
      if (a[i] == "--out") a[i + 1] = c.out.file("missing/dir/block.npy");
    expect_rejected(g3test::run_g3attn(a, guard(c.cache.path)), c.out.path);
  }
  SECTION("--out is a directory") {
    ApplyCase c;
    fs::create_directory(c.block_out());
    CmdResult r = c.run();
    expect_rejected(r, "");
    CHECK(g3test::count_entries(c.out.path) == 1);  // only the directory itself
    CHECK(g3test::count_entries(c.block_out()) == 0);
  }
  SECTION("--attn-out in a directory that does not exist: --out is removed again") {
    ApplyCase c;
    std::vector<std::string> a = c.args();
    for (size_t i = 0; i + 1 < a.size(); ++i)
      if (a[i] == "--attn-out") a[i + 1] = c.out.file("missing/attn.npy");
    expect_rejected(g3test::run_g3attn(a, guard(c.cache.path)), c.out.path);
  }
  SECTION("--out and --attn-out the same file") {
    ApplyCase c;
    std::vector<std::string> a = c.args();
    for (size_t i = 0; i + 1 < a.size(); ++i)
      if (a[i] == "--attn-out") a[i + 1] = c.block_out();
    expect_rejected(g3test::run_g3attn(a, guard(c.cache.path)), c.out.path);
  }
  SECTION("inputs that do not exist, or are directories") {
    ApplyCase c;
    std::vector<std::string> a = c.args();
    for (const char* flag : {"--config", "--weights", "--input", "--positions", "--attention-mask"}) {
      for (const std::string& bad : {c.in.file("nope"), c.out.path}) {
        std::vector<std::string> b = a;
        for (size_t i = 0; i + 1 < b.size(); ++i)
          if (b[i] == flag) b[i + 1] = bad;
        INFO(flag << " " << bad);
        expect_rejected(g3test::run_g3attn(b, guard(c.cache.path)), c.out.path);
      }
    }
  }
}

TEST_CASE("hostile apply: --json FILE that cannot be written leaves no output behind",
          "[hostile][apply][output]") {
  // Regression: a failing summary must remove --out and --attn-out again.
  ApplyCase c;
  expect_rejected(c.run({"--json", c.out.file("missing/summary.json")}), c.out.path);
}

TEST_CASE("hostile apply: bad flags", "[hostile][apply][flags]") {
  ApplyCase c;
  const std::vector<std::vector<std::string>> bad = {
      {"--layer", "-1"},     {"--layer", "abc"},   {"--layer", "99999999999999999999"}, {"--backend", "gpu"},
      {"--isa", "avx9000"},  {"--kv-dtype", "f8"}, {"--no-such-flag"},                  {"--layer"},
      {"--layer", "1", "--layer", "2"}};
  for (const auto& extra : bad) {
    std::string name;
    for (const auto& e : extra) name += e + " ";
    INFO(name);
    expect_rejected(c.run(extra), c.out.path);
  }
  expect_rejected(g3test::run_g3attn({"apply", "--config", c.cfg()}, guard(c.cache.path)), c.out.path);
}

// ---------------------------------------------------------------------------
// plan
// ---------------------------------------------------------------------------

TEST_CASE("hostile plan: absurd or malformed configs", "[hostile][plan]") {
  ApplyCase c;  // for its config and scratch directories
  auto plan = [&](const json& j, const std::vector<std::string>& extra = {}) {
    g3test::write_text(c.cfg(), j.dump(1));
    std::vector<std::string> a = {"plan", "--config", c.cfg()};
    a.insert(a.end(), extra.begin(), extra.end());
    return g3test::run_g3attn(a, guard(c.cache.path));
  };
  const json base = c.config();
  struct Dim {
    const char* field;
    json value;
  };
  for (const Dim& d : {Dim{"head_dim", int64_t{1} << 30}, Dim{"hidden_size", 1000000000},
                       Dim{"num_hidden_layers", 1000000000}, Dim{"num_attention_heads", -4},
                       Dim{"head_dim", 15}, Dim{"num_key_value_heads", 3}, Dim{"num_key_value_heads", 0},
                       Dim{"sliding_window", 0}, Dim{"query_pre_attn_scalar", 0}, Dim{"query_pre_attn_scalar", "256"},
                       Dim{"rope_theta", -1.0}, Dim{"rms_norm_eps", 0}, Dim{"hidden_size", 64.5},
                       Dim{"hidden_size", json::array({64})}, Dim{"layer_types", json::array({"sliding_attention"})},
                       Dim{"layer_types", "full_attention"}, Dim{"layer_index", 6}, Dim{"layer_index", -1},
                       Dim{"rope_scaling", json{{"rope_type", "yarn"}, {"factor", 8.0}}},
                       Dim{"rope_scaling", json{{"rope_type", "linear"}, {"factor", 0.0}}},
                       Dim{"attn_logit_softcapping", 50.0}, Dim{"model_type", "llama"}}) {
    SECTION(std::string(d.field) + " = " + d.value.dump()) {
      json j = base;
      j[d.field] = d.value;
      if (std::string(d.field) == "num_hidden_layers") j.erase("layer_types");
      expect_rejected(plan(j), c.out.path);
    }
  }
  SECTION("not JSON, not an object, empty, binary") {
    for (const std::string& t : {std::string("{\"hidden_size\": 64,"), std::string("[1,2,3]"), std::string(""),
                                 std::string("\x93NUMPY\x01\x00", 8), std::string("null")}) {
      g3test::write_text(c.cfg(), t);
      expect_rejected(g3test::run_g3attn({"plan", "--config", c.cfg()}, guard(c.cache.path)), c.out.path);
    }
  }
  SECTION("--model that does not exist") {
    expect_rejected(g3test::run_g3attn({"plan", "--model", "1t"}, guard(c.cache.path)), c.out.path);
  }
  SECTION("--json FILE in a directory that does not exist") {
    expect_rejected(g3test::run_g3attn({"plan", "--model", "1b", "--json", c.out.file("no/such/dir/plan.json")},
                                       guard(c.cache.path)),
                    c.out.path);
  }
  SECTION("--json FILE that is a directory") {
    fs::create_directory(c.out.file("d"));
    CmdResult r = g3test::run_g3attn({"plan", "--model", "1b", "--json", c.out.file("d")}, guard(c.cache.path));
    expect_rejected(r, "");
    CHECK(g3test::count_entries(c.out.path) == 1);
    CHECK(g3test::count_entries(c.out.file("d")) == 0);
  }
}

TEST_CASE("hostile plan: values that error messages quote", "[hostile][plan]") {
  // Regression: a value nested 100000 arrays deep crashed the command
  // (json::dump() recursion in the error message) and a 1 MiB string was
  // echoed whole; messages now quote containers by type and cut strings.
  ApplyCase c;
  const json base = c.config();
  auto plan = [&](const json& j) {
    g3test::write_text(c.cfg(), j.dump(1));
    return g3test::run_g3attn({"plan", "--config", c.cfg()}, guard(c.cache.path));
  };
  SECTION("a deeply nested value (100000 levels) where a number belongs") {
    // Error messages that quote the offending value must not recurse once per
    // nesting level (nlohmann's dump() does): that overflows the stack.
    std::string t = g3test::read_text(g3test::golden_file(kCase, "config.json"));
    size_t at = t.find("\"hidden_size\": 64");
    REQUIRE(at != std::string::npos);
    std::string deep = std::string(100000, '[') + std::string(100000, ']');
    t.replace(at, std::strlen("\"hidden_size\": 64"), "\"hidden_size\": " + deep);
    g3test::write_text(c.cfg(), t);
    expect_rejected(g3test::run_g3attn({"plan", "--config", c.cfg()}, guard(c.cache.path)), c.out.path);
  }
  SECTION("a very long string value is quoted in at most one short line") {
    json j = base;
    j["model_type"] = std::string(1 << 20, 'x');
    CmdResult r = plan(j);
    expect_rejected(r, c.out.path);
    CHECK(r.err.size() < 4096);
  }
}

TEST_CASE("hostile plan: alpha must stay a finite positive f32", "[hostile][plan]") {
  // Regression: query_pre_attn_scalar 1e-300 is positive and finite, but
  // alpha = 1e150 is +Inf in f32 and 1e300 gives alpha 0; validate() now
  // bounds it so alpha stays a normal f32.
  ApplyCase c;
  for (double v : {1e-300, 1e300}) {
    json j = c.config();
    j["query_pre_attn_scalar"] = v;
    c.set_config(j);
    INFO("query_pre_attn_scalar = " << v);
    expect_rejected(g3test::run_g3attn({"plan", "--config", c.cfg()}, guard(c.cache.path)), c.out.path);
  }
}

// ---------------------------------------------------------------------------
// run and generate
// ---------------------------------------------------------------------------

// A run small enough to finish in well under a second on the tiny geometry.
const std::vector<std::string> kSmallRun = {"--prompt", "16", "--decode", "2", "--chunk", "8"};

TEST_CASE("hostile run: absurd configs and flags", "[hostile][run]") {
  ApplyCase c;
  auto run = [&](std::vector<std::string> a) {
    a.insert(a.begin(), "run");
    return g3test::run_g3attn(a, guard(c.cache.path));
  };
  json base = c.config();
  for (const auto& [field, value] : std::vector<std::pair<std::string, int64_t>>{
           {"head_dim", int64_t{1} << 30}, {"hidden_size", 1000000000}, {"num_hidden_layers", 1000000000},
           {"num_attention_heads", 1 << 30}, {"sliding_window", int64_t{1} << 40}}) {
    json j = base;
    j[field] = value;
    j.erase("layer_types");
    c.set_config(j);
    INFO(field << " = " << value);
    expect_rejected(run({"--config", c.cfg()}), c.out.path);
  }
  c.set_config(base);
  {
    // The unmodified config runs, so the rejections below are about the flags.
    std::vector<std::string> a = {"--config", c.cfg()};
    a.insert(a.end(), kSmallRun.begin(), kSmallRun.end());
    CmdResult r = run(a);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
  }
  // Sizes that would need absurd memory or time are refused up front.
  for (const auto& extra : std::vector<std::vector<std::string>>{{"--prompt", "1000000000000"},
                                                                 {"--prompt", "-1"},
                                                                 {"--decode", "1000000000000"},
                                                                 {"--decode", "-1"},
                                                                 {"--batch", "1000000000"},
                                                                 {"--batch", "0"},
                                                                 {"--chunk", "0"},
                                                                 {"--threads", "-3"},
                                                                 {"--threads", "1000000"},
                                                                 {"--weight-dtype", "f8"},
                                                                 {"--model", "1b", "--config", c.cfg()},
                                                                 {"--model", "7b"}}) {
    std::vector<std::string> a = {"--config", c.cfg()};
    if (extra[0] == "--model") a.clear();
    a.insert(a.end(), extra.begin(), extra.end());
    std::string name;
    for (const auto& e : extra) name += e + " ";
    INFO(name);
    expect_rejected(run(a), c.out.path);
  }
}

TEST_CASE("hostile run: rejections before work starts", "[hostile][run][output]") {
  // Regression: run validates sizes, memory and the --json path before it
  // prints or computes anything, so each rejection is one line.
  ApplyCase c;
  // 10 global layers x 4096 rows x 131001 positions x 16 KV heads x 128 x 2 x 4 bytes: ~88 TB of global KV cache.
  // Under the usual hang guard only: how fast the refusal comes is not
  // asserted (times belong in `g3attn bench`); that it comes before any
  // allocation is, by the 4 GiB address-space limit and the one-line check.
  expect_rejected(g3test::run_g3attn({"run", "--model", "27b", "--prompt", "131000", "--batch", "4096", "--decode", "1"},
                                     guard(c.cache.path)),
                  c.out.path);
  // Beyond max_position_embeddings: rejected, but after the banner line.
  expect_rejected(g3test::run_g3attn({"run", "--model", "27b", "--prompt", "16000000", "--batch", "4096"},
                                     guard(c.cache.path)),
                  c.out.path);
  std::vector<std::string> a = {"run", "--config", c.cfg()};
  a.insert(a.end(), kSmallRun.begin(), kSmallRun.end());
  std::vector<std::string> missing = a, dir = a;
  missing.insert(missing.end(), {"--json", c.out.file("no/dir/run.json")});
  expect_rejected(g3test::run_g3attn(missing, guard(c.cache.path)), c.out.path);
  fs::create_directory(c.out.file("d"));
  dir.insert(dir.end(), {"--json", c.out.file("d")});
  expect_rejected(g3test::run_g3attn(dir, guard(c.cache.path)), "");
  CHECK(g3test::count_entries(c.out.file("d")) == 0);
}

TEST_CASE("hostile generate: absurd configs and output paths", "[hostile][generate]") {
  ApplyCase c;
  json base = c.config();
  for (const auto& [field, value] : std::vector<std::pair<std::string, int64_t>>{
           {"head_dim", int64_t{1} << 30}, {"hidden_size", 1000000000}, {"num_hidden_layers", 1000000000}}) {
    json j = base;
    j[field] = value;
    j.erase("layer_types");
    c.set_config(j);
    INFO(field << " = " << value);
    expect_rejected(g3test::run_g3attn({"generate", "--config", c.cfg(), "--out", c.out.file("g")}, guard(c.cache.path)),
                    c.out.path);
  }
  c.set_config(base);
  SECTION("--out is an existing regular file") {
    g3test::write_text(c.out.file("f"), "keep me");
    CmdResult r = g3test::run_g3attn({"generate", "--model", "1b", "--out", c.out.file("f")}, guard(c.cache.path));
    expect_rejected(r, "");
    CHECK(g3test::read_text(c.out.file("f")) == "keep me");
    CHECK(g3test::count_entries(c.out.path) == 1);
  }
  SECTION("--out under a regular file") {
    g3test::write_text(c.out.file("f"), "keep me");
    CmdResult r = g3test::run_g3attn({"generate", "--model", "1b", "--out", c.out.file("f/sub")}, guard(c.cache.path));
    expect_rejected(r, "");
    CHECK(g3test::count_entries(c.out.path) == 1);
  }
  SECTION("unknown model") {
    expect_rejected(g3test::run_g3attn({"generate", "--model", "2b", "--out", c.out.file("g")}, guard(c.cache.path)),
                    c.out.path);
  }
}

// ---------------------------------------------------------------------------
// bench (it reads the same built-in configs as the commands above)
// ---------------------------------------------------------------------------

TEST_CASE("hostile bench: configs are not accepted, built-in models only", "[hostile][bench]") {
  // bench measures the built-in sizes only, so an absurd config cannot reach
  // it: --config is refused as an unknown option before anything runs.
  ApplyCase c;
  json j = c.config();
  j["head_dim"] = int64_t{1} << 30;
  c.set_config(j);
  CmdResult r = g3test::run_g3attn({"bench", "--config", c.cfg()}, guard(c.cache.path));
  expect_rejected(r, c.out.path, "unknown option --config");
}

// ---------------------------------------------------------------------------
// every command: the error line names the command once
// ---------------------------------------------------------------------------

TEST_CASE("hostile flags: every command's error line names the command once", "[hostile][flags]") {
  // main() prefixes every refusal with "g3attn <command>: "; messages from
  // the shared argument parser must not add a second prefix (it once read
  // "g3attn plan: g3attn plan: unknown option").
  ApplyCase c;
  auto count = [](const std::string& s, const std::string& needle) {
    int n = 0;
    for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
    return n;
  };
  for (const std::string cmd : {"plan", "apply", "run", "bench", "generate"}) {
    const std::string prefix = "g3attn " + cmd + ": ";
    const std::vector<std::vector<std::string>> bad = {
        {cmd, "--no-such-option"},                  // unknown option
        {cmd, "stray"},                             // positional argument
        {cmd, "--model", "1b", "--model", "4b"},    // given twice (every command but apply has --model)
        {cmd, "--isa", "neon"},                     // a value the option parser accepts, a later check refuses
    };
    for (const auto& args : bad) {
      if (cmd == "apply" && args.size() == 5) continue;  // apply has no --model
      CmdResult r = g3test::run_g3attn(args, guard(c.cache.path));
      std::string joined;
      for (const auto& a : args) joined += a + " ";
      INFO("g3attn " << joined << "-> " << r.err);
      expect_rejected(r, "");
      CHECK(r.err.rfind(prefix, 0) == 0);
      CHECK(count(r.err, prefix) == 1);
      CHECK(count(r.err, "g3attn: ") == 0);
    }
  }
  // The whole line, byte for byte: the command, what is wrong and where the
  // valid options are listed, as README's command reference promises.
  CmdResult r = g3test::run_g3attn({"plan", "--bogus"}, guard(c.cache.path));
  CHECK(r.err == "g3attn plan: unknown option --bogus (see g3attn plan --help)\n");
}
