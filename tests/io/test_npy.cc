// The .npy reader and writer: round trips, the golden files, and one test per
// way a file can be wrong, each checking that the message names the file and
// the problem.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "generator/errors.h"
#include "runtime/io/npy.h"
#include "tests/support/test_support.h"

using Catch::Matchers::Contains;

namespace {

// Builds a .npy file around an arbitrary header text so tests can state the
// exact header they mean. The header is padded with spaces and a newline to a
// multiple of 64 bytes like NumPy does; `version` picks the length field width.
std::vector<uint8_t> raw_npy(const std::string& dict, const std::vector<uint8_t>& data, int version = 1) {
  size_t prefix = version == 1 ? 10 : 12;
  std::string header = dict;
  size_t unpadded = prefix + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(version), 0};
  uint32_t len = static_cast<uint32_t>(header.size());
  out.push_back(static_cast<uint8_t>(len));
  out.push_back(static_cast<uint8_t>(len >> 8));
  if (version != 1) {
    out.push_back(static_cast<uint8_t>(len >> 16));
    out.push_back(static_cast<uint8_t>(len >> 24));
  }
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

g3::NpyArray parse(const std::vector<uint8_t>& bytes, const std::string& name = "t.npy") {
  return g3::parse_npy(bytes.data(), bytes.size(), name);
}

// Parses `bytes` expecting an InputError whose message names the file and
// contains `needle`.
void expect_error(const std::vector<uint8_t>& bytes, const std::string& needle) {
  CHECK_THROWS_AS(parse(bytes, "bad.npy"), g3::InputError);
  CHECK_THROWS_WITH(parse(bytes, "bad.npy"), Contains("bad.npy: ") && Contains(needle));
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

TEST_CASE("npy: float32 and int32 round trip through a file", "[npy]") {
  g3test::TempDir dir;
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {3}, {2, 3, 4}};
  for (const auto& shape : shapes) {
    INFO("shape rank " << shape.size());
    const size_t n = static_cast<size_t>(numel(shape));
    std::vector<float> f(n);
    std::vector<int32_t> p(n);
    for (size_t i = 0; i < n; ++i) {
      f[i] = 0.5f * static_cast<float>(i) - 3.25f;
      p[i] = static_cast<int32_t>(i * 7) - 50;
    }
    if (n) p[0] = INT32_MIN;
    g3::write_npy_f32(dir.file("a.npy"), f.data(), shape);
    g3::write_file_atomic(dir.file("p.npy"), g3::npy_bytes_i32(p.data(), shape));
    const g3::NpyArray a = g3::read_npy_f32(dir.file("a.npy")), b = g3::read_npy_i32(dir.file("p.npy"));
    CHECK(a.type == g3::NpyArray::Type::F32);
    CHECK(b.type == g3::NpyArray::Type::I32);
    CHECK(a.shape == shape);
    CHECK(b.shape == shape);
    CHECK(a.size() == numel(shape));
    CHECK(a.f32 == f);
    CHECK(b.i32 == p);
    CHECK(a.i32.empty());
    CHECK(b.f32.empty());
  }
  // Special values survive bit for bit.
  std::vector<float> special = {INFINITY, -INFINITY, -0.0f, 1e-45f, 3.4028235e38f};
  g3::write_npy_f32(dir.file("s.npy"), special.data(), {5});
  g3::NpyArray s = g3::read_npy_f32(dir.file("s.npy"));
  REQUIRE(s.f32.size() == 5);
  CHECK(std::memcmp(s.f32.data(), special.data(), 20) == 0);
  // Only the targets are left behind (a.npy, p.npy, s.npy): no temporary files.
  CHECK(g3test::count_entries(dir.path) == 3);
}

TEST_CASE("npy: written header follows NumPy's layout", "[npy]") {
  std::vector<float> v(6, 1.0f);
  std::vector<uint8_t> b = g3::npy_bytes_f32(v.data(), {2, 3});
  REQUIRE(b.size() > 10);
  CHECK(std::memcmp(b.data(), "\x93NUMPY\x01\x00", 8) == 0);
  size_t hlen = b[8] | (b[9] << 8);
  CHECK((10 + hlen) % 64 == 0);
  CHECK(b[10 + hlen - 1] == '\n');
  std::string header(b.begin() + 10, b.begin() + 10 + static_cast<long>(hlen));
  CHECK(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0) == 0);
  CHECK(b.size() == 10 + hlen + 24);

  std::vector<int32_t> one = {5};
  std::vector<uint8_t> c = g3::npy_bytes_i32(one.data(), {1});
  std::string h1(c.begin() + 10, c.begin() + 10 + (c[8] | (c[9] << 8)));
  CHECK(h1.rfind("{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }", 0) == 0);
  float scalar = 7.0f;
  std::vector<uint8_t> z = g3::npy_bytes_f32(&scalar, {});
  std::string h0(z.begin() + 10, z.begin() + 10 + (z[8] | (z[9] << 8)));
  CHECK(h0.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 0) == 0);
  CHECK(parse(z).f32 == std::vector<float>{7.0f});
  // An empty array needs no data pointer; a 0-d array (one element) does.
  CHECK(parse(g3::npy_bytes_f32(nullptr, {0, 5})).f32.empty());
  CHECK_THROWS_AS(g3::npy_bytes_f32(nullptr, {}), g3::InputError);
}

TEST_CASE("npy: negative dimensions cannot be written", "[npy]") {
  CHECK_THROWS_AS(g3::npy_bytes_f32(nullptr, {2, -1}), g3::InputError);
}

TEST_CASE("npy: golden files read in place", "[npy][golden]") {
  const std::string dir = g3test::golden_dir() + "/tiny_global_L5_T12_B2_rightpad";
  REQUIRE(g3test::file_exists(g3test::golden_file("tiny_global_L5_T12_B2_rightpad", "x.npy")));
  g3::NpyArray x = g3::read_npy_f32(dir + "/x.npy");
  CHECK(x.shape == std::vector<int64_t>{2, 12, 64});
  REQUIRE(x.f32.size() == 2 * 12 * 64);
  bool all_finite = true;
  for (float f : x.f32) all_finite = all_finite && std::isfinite(f);
  CHECK(all_finite);

  g3::NpyArray pos = g3::read_npy_i32(dir + "/positions.npy");
  CHECK(pos.shape == std::vector<int64_t>{2, 12});
  REQUIRE(pos.i32.size() == 24);
  // Row 0 counts 0..11; row 1 is right-padded by 3, pads carry position 1.
  for (int t = 0; t < 12; ++t) CHECK(pos.i32[static_cast<size_t>(t)] == t);
  for (int t = 0; t < 9; ++t) CHECK(pos.i32[static_cast<size_t>(12 + t)] == t);
  for (int t = 9; t < 12; ++t) CHECK(pos.i32[static_cast<size_t>(12 + t)] == 1);

  // Re-serialising reproduces NumPy's bytes exactly.
  CHECK(g3::npy_bytes_f32(x.f32.data(), x.shape) == g3test::read_bytes(dir + "/x.npy"));
  CHECK(g3::npy_bytes_i32(pos.i32.data(), pos.shape) == g3test::read_bytes(dir + "/positions.npy"));

  // Every .npy of every golden case parses.
  for (const std::string& c : g3test::golden_cases()) {
    for (const char* f : {"x.npy", "attn_out.npy", "block_out.npy"}) {
      INFO(c << "/" << f);
      CHECK_NOTHROW(g3::read_npy_f32(g3test::golden_file(c, f)));
    }
    CHECK_NOTHROW(g3::read_npy_i32(g3test::golden_file(c, "positions.npy")));
  }
}

TEST_CASE("npy: read_npy_f32 and read_npy_i32 name what they found", "[npy][errors]") {
  const std::string p = g3test::golden_file("tiny_global_L5_T12_B2_rightpad", "positions.npy");
  CHECK_THROWS_AS(g3::read_npy_f32(p), g3::InputError);
  CHECK_THROWS_WITH(g3::read_npy_f32(p),
                    Contains("positions.npy: ") && Contains("expected float32") && Contains("found int32"));
  CHECK_THROWS_WITH(g3::read_npy_i32(g3test::golden_file("tiny_global_L5_T12_B2_rightpad", "x.npy")),
                    Contains("x.npy: ") && Contains("expected int32") && Contains("found float32"));
}

TEST_CASE("npy: format versions 2.0 and 3.0", "[npy]") {
  std::vector<float> v = {1.5f, -2.0f, 3.0f};
  for (int version : {2, 3}) {
    INFO("version " << version);
    g3::NpyArray a = parse(raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", f32_bytes(v), version));
    CHECK(a.shape == std::vector<int64_t>{3});
    CHECK(a.f32 == v);
  }
}

TEST_CASE("npy: header dict syntax is tolerated where Python allows it", "[npy]") {
  std::vector<uint8_t> data = f32_bytes({1, 2, 3, 4, 5, 6});
  SECTION("keys in another order, double quotes, no trailing comma") {
    g3::NpyArray a = parse(raw_npy("{\"shape\": (2, 3), \"fortran_order\": False, \"descr\": \"<f4\"}", data));
    CHECK(a.shape == std::vector<int64_t>{2, 3});
  }
  SECTION("extra whitespace and a trailing comma inside the tuple") {
    g3::NpyArray a = parse(raw_npy("  {  'descr' :'<f4' ,\t'fortran_order':False,'shape':( 2 , 3 , ) ,  }", data));
    CHECK(a.shape == std::vector<int64_t>{2, 3});
    CHECK(a.f32[5] == 6.0f);
  }
}

TEST_CASE("npy: unsupported dtypes", "[npy][errors]") {
  const std::string tail = "', 'fortran_order': False, 'shape': (2,), }";
  SECTION("float64 '<f8'") {
    expect_error(raw_npy("{'descr': '<f8" + tail, std::vector<uint8_t>(16)),
                 "dtype '<f8' is not supported (need little-endian float32 '<f4' or int32 '<i4')");
  }
  SECTION("big-endian float32 '>f4'") {
    expect_error(raw_npy("{'descr': '>f4" + tail, std::vector<uint8_t>(8)), "dtype '>f4' is not supported");
  }
  SECTION("uint8 '|u1'") {
    expect_error(raw_npy("{'descr': '|u1" + tail, std::vector<uint8_t>(2)), "dtype '|u1' is not supported");
  }
  SECTION("structured dtype") {
    expect_error(raw_npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", std::vector<uint8_t>(8)),
                 "'descr' must be a string");
  }
}

TEST_CASE("npy: Fortran order is rejected", "[npy][errors]") {
  expect_error(raw_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", std::vector<uint8_t>(24)),
               "Fortran order not supported");
}

TEST_CASE("npy: not a .npy file", "[npy][errors]") {
  SECTION("text") {
    std::string t = "hello, this is not numpy";
    expect_error(std::vector<uint8_t>(t.begin(), t.end()), "not a .npy file (bad magic)");
  }
  SECTION("empty") { expect_error({}, "not a .npy file (bad magic)"); }
  SECTION("a safetensors file") {
    std::vector<uint8_t> b = g3test::read_bytes(g3test::golden_file("tiny_global_L5_T12_B2_rightpad", "weights.safetensors"));
    expect_error(b, "not a .npy file (bad magic)");
  }
  SECTION("magic only") { expect_error({0x93, 'N', 'U', 'M', 'P', 'Y', 1}, "truncated .npy file"); }
  SECTION("unknown format version") {
    std::vector<uint8_t> b = raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", f32_bytes({1}));
    b[6] = 4;
    expect_error(b, "format version 4.0 is not supported");
  }
}

TEST_CASE("npy: data length must match the shape exactly", "[npy][errors]") {
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  SECTION("truncated data") { expect_error(raw_npy(dict, std::vector<uint8_t>(23)), "truncated data"); }
  SECTION("no data at all") { expect_error(raw_npy(dict, {}), "needs 24 bytes but the file has 0"); }
  SECTION("trailing data") { expect_error(raw_npy(dict, std::vector<uint8_t>(25)), "trailing data"); }
  SECTION("header length past the end of the file") {
    std::vector<uint8_t> b = raw_npy(dict, std::vector<uint8_t>(24));
    b.resize(40);
    expect_error(b, "truncated .npy file (header length");
  }
}

TEST_CASE("npy: absurd shapes are rejected before allocating", "[npy][errors]") {
  SECTION("product above 2^40") {
    expect_error(raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1048576, 1048576, 2), }", {}),
                 "absurdly large");
  }
  SECTION("product that would overflow 64 bits") {
    expect_error(raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296), }", {}),
                 "absurdly large");
  }
  SECTION("a single dimension with more digits than any integer type") {
    expect_error(raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (123456789012345678901234567890,), }", {}),
                 "larger than 2^40");
  }
  SECTION("negative dimension") {
    expect_error(raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", {}), "negative dimension");
  }
}

TEST_CASE("npy: malformed header dicts", "[npy][errors]") {
  auto check = [](const std::string& dict, const std::string& needle) {
    INFO("header: " << dict);
    expect_error(raw_npy(dict, std::vector<uint8_t>(8)), "malformed .npy header");
    expect_error(raw_npy(dict, std::vector<uint8_t>(8)), needle);
  };
  SECTION("not a dict") { check("['<f4', False, (2,)]", "expected '{'"); }
  SECTION("unclosed dict") { check("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), ", "expected a quoted string"); }
  SECTION("missing key") { check("{'descr': '<f4', 'shape': (2,), }", "'fortran_order' is missing"); }
  SECTION("unknown key") { check("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", "unexpected key 'x'"); }
  SECTION("duplicate key") { check("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "appears twice"); }
  SECTION("missing colon") { check("{'descr' '<f4', 'fortran_order': False, 'shape': (2,)}", "expected ':'"); }
  SECTION("missing comma") { check("{'descr': '<f4' 'fortran_order': False, 'shape': (2,)}", "expected ',' or '}'"); }
  SECTION("unterminated string") { check("{'descr: '<f4', 'fortran_order': False, 'shape': (2,)}", "expected ':'"); }
  SECTION("fortran_order not a bool") { check("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "True or False"); }
  SECTION("lower-case bool") { check("{'descr': '<f4', 'fortran_order': false, 'shape': (2,)}", "True or False"); }
  SECTION("shape is a list") { check("{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", "must be a tuple"); }
  SECTION("shape (2) is an integer, not a tuple") {
    check("{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", "is not a tuple");
  }
  SECTION("float dimension") { check("{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,)}", "expected ',' or ')'"); }
  SECTION("empty dimension") { check("{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", "expected a dimension"); }
  SECTION("text after the dict") { check("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk", "after the closing '}'"); }
  SECTION("escape in a string") { check("{'desc\\x72': '<f4', 'fortran_order': False, 'shape': (2,)}", "escape"); }
  SECTION("binary garbage") { check(std::string("\x01\x02\xff", 3), "expected '{'"); }
}

TEST_CASE("npy: a missing file names the path and the reason", "[npy][errors]") {
  g3test::TempDir dir;
  std::string p = dir.file("nope.npy");
  CHECK_THROWS_AS(g3::read_npy(p), g3::InputError);
  CHECK_THROWS_WITH(g3::read_npy(p), p + ": cannot open (No such file or directory)");
  CHECK_THROWS_WITH(g3::read_npy(dir.path), Contains(dir.path + ": ") && Contains("directory"));
}

TEST_CASE("npy: pipes and devices are read no further than the header needs", "[npy][errors]") {
  // /dev/zero never ends: its first bytes are refused.
  if (access("/dev/zero", R_OK) == 0) CHECK_THROWS_WITH(g3::read_npy("/dev/zero"), "/dev/zero: not a .npy file (bad magic)");
  // A FIFO (a shell's <(...) is one): a whole array reads as from a file;
  // an array followed by more bytes than the header says is refused as
  // trailing data, also when the writer would go on for a terabyte.
  g3test::TempDir dir;
  const std::string fifo = dir.file("x.npy");
  const std::vector<uint8_t> bytes =
      raw_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f32_bytes({1, 2, 3, 4, 5, 6}));
  const std::string data(bytes.begin(), bytes.end());
  g3::NpyArray whole;
  CHECK(g3test::read_from_fifo(fifo, data, 0, [&] { whole = g3::read_npy(fifo); }).empty());
  CHECK(whole.shape == std::vector<int64_t>{2, 3});
  CHECK(whole.f32 == std::vector<float>{1, 2, 3, 4, 5, 6});
  CHECK(g3test::read_from_fifo(fifo, data, size_t{1} << 40, [&] { g3::read_npy(fifo); }) ==
        fifo + ": trailing data: the header and shape need " + std::to_string(bytes.size()) +
            " bytes but the stream goes on past them");
}

TEST_CASE("npy: write_file_atomic replaces the target and cleans up on failure", "[npy][write]") {
  g3test::TempDir dir;
  std::string p = dir.file("out.bin");
  g3::write_file_atomic(p, {1, 2, 3});
  g3::write_file_atomic(p, {4, 5});
  CHECK(g3test::read_bytes(p) == std::vector<uint8_t>{4, 5});
  g3::write_file_atomic(p, {});
  CHECK(g3test::read_bytes(p).empty());
  CHECK(g3test::count_entries(dir.path) == 1);

  SECTION("a symlink is followed: its file is replaced, the link stays") {
    const std::string link = dir.file("link.bin");
    REQUIRE(symlink("out.bin", link.c_str()) == 0);
    g3::write_file_atomic(link, {7, 8, 9});
    CHECK(g3test::read_bytes(p) == std::vector<uint8_t>{7, 8, 9});
    struct stat st = {};
    REQUIRE(lstat(link.c_str(), &st) == 0);
    CHECK(S_ISLNK(st.st_mode));
    CHECK(g3test::count_entries(dir.path) == 2);
  }
  SECTION("a FIFO (a device, /dev/stdout) is written in place, not replaced") {
    const std::string fifo = dir.file("out.fifo");
    std::string got;
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    std::thread reader([&] { got = g3test::read_text(fifo); });  // opens when the writer does
    g3::write_file_atomic(fifo, {'a', 'b', 'c'});
    reader.join();
    CHECK(got == "abc");
    struct stat st = {};
    REQUIRE(stat(fifo.c_str(), &st) == 0);
    CHECK(S_ISFIFO(st.st_mode));
    CHECK(g3test::count_entries(dir.path) == 2);
  }
  SECTION("directory does not exist") {
    std::string bad = dir.file("no/such/dir/x.npy");
    CHECK_THROWS_AS(g3::write_file_atomic(bad, {1}), g3::InputError);
    CHECK_THROWS_WITH(g3::write_file_atomic(bad, {1}), "cannot write " + bad + ": No such file or directory");
  }
  SECTION("target is a directory: the temporary file is removed") {
    std::string sub = dir.file("sub");
    g3test::write_text(sub + ".keep", "");  // an unrelated file, to count against
    REQUIRE(g3test::run_shell("mkdir '" + sub + "' && touch '" + sub + "/f'").exit_code == 0);
    CHECK_THROWS_WITH(g3::write_file_atomic(sub, {1, 2}), Contains("cannot write " + sub + ": "));
    CHECK(g3test::count_entries(dir.path) == 3);  // out.bin, sub, sub.keep
  }
}
