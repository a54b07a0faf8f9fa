// The safetensors reader: the golden weights, dtype conversion, and one
// synthetic file per validation rule, each checking that the message names
// the file and the problem.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "generator/errors.h"
#include "runtime/io/safetensors.h"
#include "tests/support/test_support.h"

using Catch::Matchers::Contains;

namespace {

// A safetensors file from a JSON header text and raw data bytes: the 8-byte
// little-endian header length, the header, then the data section.
std::vector<uint8_t> st_bytes(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  uint64_t n = header.size();
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  if (!header.empty()) std::memcpy(out.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(out.data() + 8 + header.size(), data.data(), data.size());
  return out;
}

std::vector<uint8_t> u16_bytes(const std::vector<uint16_t>& v) {
  std::vector<uint8_t> b(v.size() * 2);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::shared_ptr<g3::SafeTensorsFile> load(const std::vector<uint8_t>& bytes, const std::string& name = "w.safetensors") {
  return g3::SafeTensorsFile::from_bytes(bytes.data(), bytes.size(), name);
}

// Expects an InputError naming the file and containing `needle`.
void expect_error(const std::vector<uint8_t>& bytes, const std::string& needle) {
  CHECK_THROWS_AS(load(bytes, "bad.safetensors"), g3::InputError);
  CHECK_THROWS_WITH(load(bytes, "bad.safetensors"), Contains("bad.safetensors: ") && Contains(needle));
}

// One tensor entry of a header.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// A header object from entries, e.g. obj({entry(...), entry(...)}); `prefix`
// is inserted first (e.g. a __metadata__ entry) and `pad` after the brace.
// Built with append: GCC 12 warns falsely (-Wrestrict) on "lit" + string&&.
std::string obj(std::initializer_list<std::string> entries, const std::string& prefix = "", const std::string& pad = "") {
  std::string s = "{";
  s.append(prefix);
  bool first = prefix.empty();
  for (const std::string& e : entries) {
    if (!first) s.append(",");
    s.append(e);
    first = false;
  }
  s.append("}");
  s.append(pad);
  return s;
}

const std::string kGoldenCase = "tiny_global_L5_T12_B2_rightpad";

}  // namespace

TEST_CASE("safetensors: golden weights", "[safetensors][golden]") {
  const std::string path = g3test::golden_file(kGoldenCase, "weights.safetensors");
  auto f = g3::SafeTensorsFile::open(path);
  CHECK(f->path() == path);
  CHECK(f->tensors().size() == 8);
  CHECK(f->metadata().at("format") == "pt");

  const std::string q = "model.layers.5.self_attn.q_proj.weight";
  REQUIRE(f->has(q));
  const g3::TensorView& t = f->get(q);
  CHECK(t.name == q);
  CHECK(t.dtype == g3::TensorDType::BF16);
  CHECK(std::string(g3::to_string(t.dtype)) == "BF16");
  CHECK(t.shape == std::vector<int64_t>{64, 64});
  CHECK(t.numel() == 4096);
  CHECK(t.nbytes == 8192);
  std::vector<float> v = t.to_f32();
  REQUIRE(v.size() == 4096);
  // The first two bf16 words are 0xBD68 and 0x3D34.
  CHECK(v[0] == -0.056640625f);
  CHECK(v[1] == 0.0439453125f);
  bool sensible = true;
  double sum_sq = 0;
  for (float x : v) {
    sensible = sensible && std::isfinite(x) && std::fabs(x) < 10.0f;
    sum_sq += static_cast<double>(x) * x;
  }
  CHECK(sensible);
  CHECK(sum_sq > 0);

  // The view points at the right bytes of the file.
  std::vector<uint8_t> raw = g3test::read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  const size_t begin = 8 + n + 12608;  // q_proj's data_offsets begin
  for (size_t i = 0; i < 4096; i += 511) {
    uint32_t bits = static_cast<uint32_t>(raw[begin + 2 * i] | (raw[begin + 2 * i + 1] << 8)) << 16;
    float want;
    std::memcpy(&want, &bits, 4);
    CHECK(v[i] == want);
  }

  CHECK(f->get("model.layers.5.self_attn.k_norm.weight").shape == std::vector<int64_t>{16});
  CHECK(f->get("model.layers.5.self_attn.k_proj.weight").shape == std::vector<int64_t>{32, 64});

  // The same bytes through from_bytes give the same tensors.
  auto g = g3::SafeTensorsFile::from_bytes(raw.data(), raw.size(), "copy");
  CHECK(g->get(q).to_f32() == v);
}

TEST_CASE("safetensors: every golden weights file validates", "[safetensors][golden]") {
  for (const std::string& c : g3test::golden_cases()) {
    INFO(c);
    std::shared_ptr<g3::SafeTensorsFile> f;
    REQUIRE_NOTHROW(f = g3::SafeTensorsFile::open(g3test::golden_file(c, "weights.safetensors")));
    CHECK(f->tensors().size() == 8);
    for (const auto& [name, t] : f->tensors()) {
      CHECK(static_cast<int64_t>(t.to_f32().size()) == t.numel());
    }
  }
}

TEST_CASE("safetensors: HF layer prefixes", "[safetensors]") {
  CHECK(g3::hf_layer_prefixes() ==
        std::vector<std::string>{"model.layers.", "model.language_model.layers.", "language_model.model.layers."});
}

TEST_CASE("safetensors: conversions to float32", "[safetensors]") {
  SECTION("F16 values, including subnormals, infinities and NaN") {
    // 1.0, -2.5, smallest subnormal 2^-24, largest subnormal 1023 * 2^-24,
    // smallest normal 2^-14, max 65504, +inf, -inf, -0, NaN.
    std::vector<uint16_t> h = {0x3C00, 0xC100, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00, 0x8000, 0x7E00};
    auto f = load(st_bytes(obj({entry("h", "F16", "[10]", 0, 20)}), u16_bytes(h)));
    std::vector<float> v = f->get("h").to_f32();
    REQUIRE(v.size() == 10);
    CHECK(v[0] == 1.0f);
    CHECK(v[1] == -2.5f);
    CHECK(v[2] == std::ldexp(1.0f, -24));
    CHECK(v[3] == std::ldexp(1023.0f, -24));
    CHECK(v[4] == std::ldexp(1.0f, -14));
    CHECK(v[5] == 65504.0f);
    CHECK(v[6] == INFINITY);
    CHECK(v[7] == -INFINITY);
    CHECK(v[8] == 0.0f);
    CHECK(std::signbit(v[8]));
    CHECK(std::isnan(v[9]));
  }
  SECTION("every F16 value converts like a reference formula") {
    std::vector<uint16_t> all(65536);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
    auto f = load(st_bytes(obj({entry("h", "F16", "[65536]", 0, 131072)}), u16_bytes(all)));
    std::vector<float> v = f->get("h").to_f32();
    int wrong = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      int e = static_cast<int>((i >> 10) & 31);
      double m = i & 1023;
      double want = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m == 0 ? INFINITY : NAN) : std::ldexp(1024 + m, e - 25);
      if (i & 0x8000) want = -want;
      bool ok = std::isnan(want) ? std::isnan(v[i]) : (static_cast<double>(v[i]) == want && std::signbit(v[i]) == std::signbit(want));
      if (!ok) ++wrong;
    }
    CHECK(wrong == 0);
  }
  SECTION("BF16 and unaligned F32") {
    // A 1-element F16 tensor first puts the F32 tensor at byte 2, unaligned.
    std::vector<uint8_t> data = u16_bytes({0x3C00});
    std::vector<uint8_t> b = u16_bytes({0x3F80, 0xC020, 0x7F80});  // 1.0, -2.5, +inf
    std::vector<uint8_t> f = f32_bytes({0.1f, -7.0f});
    data.insert(data.end(), f.begin(), f.end());
    data.insert(data.end(), b.begin(), b.end());
    std::string hdr = obj({entry("a", "F16", "[]", 0, 2), entry("f", "F32", "[2, 1]", 2, 10), entry("b", "BF16", "[3]", 10, 16)});
    auto st = load(st_bytes(hdr, data));
    CHECK(st->get("a").numel() == 1);
    CHECK(st->get("a").to_f32() == std::vector<float>{1.0f});
    CHECK(st->get("f").to_f32() == std::vector<float>{0.1f, -7.0f});
    CHECK(st->get("f").shape == std::vector<int64_t>{2, 1});
    CHECK(st->get("b").to_f32() == std::vector<float>{1.0f, -2.5f, INFINITY});
  }
}

TEST_CASE("safetensors: valid corner cases", "[safetensors]") {
  SECTION("__metadata__ is parsed") {
    auto f = load(st_bytes(obj({entry("x", "F32", "[1]", 0, 4)}, "\"__metadata__\":{\"format\":\"pt\",\"note\":\"hi\"}"),
                           f32_bytes({2.0f})));
    CHECK(f->metadata().size() == 2);
    CHECK(f->metadata().at("note") == "hi");
    CHECK(f->tensors().size() == 1);
    CHECK_FALSE(f->has("__metadata__"));
  }
  SECTION("header padded with trailing spaces") {
    auto f = load(st_bytes(obj({entry("x", "F32", "[1]", 0, 4)}, "", "       "), f32_bytes({2.0f})));
    CHECK(f->get("x").to_f32() == std::vector<float>{2.0f});
  }
  SECTION("no tensors and no data") {
    auto f = load(st_bytes("{}", {}));
    CHECK(f->tensors().empty());
  }
  SECTION("empty tensors share an offset") {
    auto f = load(st_bytes(obj({entry("e1", "F32", "[0]", 0, 0), entry("e2", "BF16", "[4, 0]", 0, 0), entry("x", "F32", "[1]", 0, 4), entry("e3", "F16", "[0, 9]", 4, 4)}),
                           f32_bytes({1.0f})));
    CHECK(f->get("e2").numel() == 0);
    CHECK(f->get("e2").to_f32().empty());
  }
  SECTION("open() through a file") {
    g3test::TempDir dir;
    std::string p = dir.file("m.safetensors");
    g3test::write_bytes(p, st_bytes(obj({entry("x", "BF16", "[2]", 0, 4)}), u16_bytes({0x4000, 0xBF80})));
    auto f = g3::SafeTensorsFile::open(p);
    CHECK(f->get("x").to_f32() == std::vector<float>{2.0f, -1.0f});
  }
}

TEST_CASE("safetensors: file too short or header length wrong", "[safetensors][errors]") {
  SECTION("empty") { expect_error({}, "file is empty"); }
  SECTION("shorter than 8 bytes") { expect_error({1, 0, 0}, "file is 3 bytes, shorter than the 8-byte header length"); }
  SECTION("header length beyond the file") {
    std::vector<uint8_t> b = st_bytes("{}", {});
    b[0] = 200;
    expect_error(b, "header length 200 exceeds the file size 10");
  }
  SECTION("truncated file: data section cut short") {
    std::vector<uint8_t> b = st_bytes(obj({entry("x", "F32", "[4]", 0, 16)}), f32_bytes({1, 2, 3, 4}));
    b.resize(b.size() - 5);
    expect_error(b, "run past the end of the data section (11 bytes)");
  }
  SECTION("truncated file: header cut short") {
    std::vector<uint8_t> b = st_bytes(obj({entry("x", "F32", "[4]", 0, 16)}), {});
    b.resize(20);
    expect_error(b, "exceeds the file size 20");
  }
  SECTION("absurd header length") {
    std::vector<uint8_t> b(16, 0xff);
    expect_error(b, "header length 18446744073709551615 is absurd");
  }
}

TEST_CASE("safetensors: header must be a JSON object", "[safetensors][errors]") {
  SECTION("not JSON") { expect_error(st_bytes("{\"x\": nonsense}", {}), "header is not valid JSON"); }
  SECTION("binary garbage") { expect_error(st_bytes(std::string("\xff\xfe\x00\x01", 4), {}), "header is not valid JSON"); }
  SECTION("empty header") { expect_error(st_bytes("", {}), "header is not valid JSON"); }
  SECTION("trailing text after the object") { expect_error(st_bytes("{} x", {}), "header is not valid JSON"); }
  SECTION("an array") { expect_error(st_bytes("[1, 2]", {}), "header is not a JSON object (found array)"); }
  SECTION("a string") { expect_error(st_bytes("\"hi\"", {}), "header is not a JSON object (found string)"); }
  SECTION("duplicate tensor name") {
    expect_error(st_bytes(obj({entry("x", "F32", "[1]", 0, 4), entry("x", "F32", "[1]", 0, 4)}), f32_bytes({1})),
                 "header has the key 'x' more than once");
  }
}

TEST_CASE("safetensors: __metadata__ must map strings to strings", "[safetensors][errors]") {
  SECTION("not an object") { expect_error(st_bytes("{\"__metadata__\": [1]}", {}), "__metadata__ is not an object"); }
  SECTION("a value is not a string") {
    expect_error(st_bytes("{\"__metadata__\": {\"n\": 3}}", {}), "__metadata__ value for 'n' is not a string");
  }
}

TEST_CASE("safetensors: tensor entries are validated", "[safetensors][errors]") {
  const std::vector<uint8_t> d4 = f32_bytes({1});
  SECTION("entry not an object") { expect_error(st_bytes("{\"x\": 5}", {}), "tensor x: entry is not an object"); }
  SECTION("missing dtype") {
    expect_error(st_bytes("{\"x\":{\"shape\":[1],\"data_offsets\":[0,4]}}", d4), "tensor x: missing \"dtype\"");
  }
  SECTION("missing shape") {
    expect_error(st_bytes("{\"x\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", d4), "tensor x: missing \"shape\"");
  }
  SECTION("missing data_offsets") {
    expect_error(st_bytes("{\"x\":{\"dtype\":\"F32\",\"shape\":[1]}}", d4), "tensor x: missing \"data_offsets\"");
  }
  SECTION("unsupported dtypes") {
    for (const char* dt : {"F64", "I32", "U8", "BOOL", "F8_E4M3"}) {
      INFO(dt);
      expect_error(st_bytes(obj({entry("x", dt, "[1]", 0, 4)}), d4),
                   std::string("tensor x has unsupported dtype ") + dt + " (supported: F32, BF16, F16)");
    }
  }
  SECTION("unknown dtype") {
    expect_error(st_bytes(obj({entry("x", "f32", "[1]", 0, 4)}), d4), "tensor x has unknown dtype 'f32'");
  }
  SECTION("negative dimension") {
    expect_error(st_bytes(obj({entry("x", "F32", "[-1]", 0, 4)}), d4), "tensor x: \"shape\" must hold non-negative integers");
  }
  SECTION("fractional dimension") {
    expect_error(st_bytes(obj({entry("x", "F32", "[1.5]", 0, 4)}), d4), "non-negative integers");
  }
  SECTION("shape not an array") { expect_error(st_bytes(obj({entry("x", "F32", "4", 0, 4)}), d4), "\"shape\" is not an array"); }
  SECTION("shape x dtype does not match the byte span") {
    expect_error(st_bytes(obj({entry("x", "F32", "[2]", 0, 4)}), d4),
                 "tensor x: shape [2] x F32 needs 8 bytes but data_offsets [0, 4] span 4 bytes");
    expect_error(st_bytes(obj({entry("x", "BF16", "[1]", 0, 4)}), d4), "shape [1] x BF16 needs 2 bytes but");
  }
  SECTION("shape whose product overflows 64 bits") {
    expect_error(st_bytes(obj({entry("x", "F32", "[4294967296, 4294967296, 16]", 0, 4)}), d4),
                 "x F32 needs more than 2^62 bytes but data_offsets [0, 4] span 4 bytes");
  }
  SECTION("offsets out of range") {
    expect_error(st_bytes(obj({entry("x", "F32", "[2]", 0, 8)}), d4),
                 "tensor x: data_offsets [0, 8] run past the end of the data section (4 bytes)");
  }
  SECTION("offsets far out of range") {
    expect_error(st_bytes(obj({entry("x", "F32", "[1]", 18446744073709551600ull, 18446744073709551604ull)}), d4),
                 "non-negative integers");
    expect_error(st_bytes(obj({entry("x", "F32", "[1]", 9000000000000000000ull, 9000000000000000004ull)}), d4),
                 "run past the end of the data section");
  }
  SECTION("begin after end") {
    expect_error(st_bytes(obj({entry("x", "F32", "[0]", 4, 0)}), d4), "has begin after end");
  }
  SECTION("data_offsets malformed") {
    expect_error(st_bytes("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", d4), "must be an array [begin, end]");
    expect_error(st_bytes("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}}", d4), "non-negative integers");
  }
}

TEST_CASE("safetensors: tensors must tile the data section", "[safetensors][errors]") {
  const std::vector<uint8_t> d8 = f32_bytes({1, 2});
  SECTION("overlapping offsets") {
    expect_error(st_bytes(obj({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[1]", 4, 8)}), d8),
                 "tensors a and b overlap");
  }
  SECTION("two tensors on the same bytes") {
    expect_error(st_bytes(obj({entry("a", "F32", "[1]", 0, 4), entry("b", "F32", "[1]", 0, 4), entry("c", "F32", "[1]", 4, 8)}), d8),
                 "overlap");
  }
  SECTION("gap between tensors") {
    std::vector<uint8_t> d12 = f32_bytes({1, 2, 3});
    expect_error(st_bytes(obj({entry("a", "F32", "[1]", 0, 4), entry("b", "F32", "[1]", 8, 12)}), d12),
                 "gap in the data section: bytes [4, 8) belong to no tensor (before tensor b)");
  }
  SECTION("gap at the start") {
    expect_error(st_bytes(obj({entry("b", "F32", "[1]", 4, 8)}), d8), "bytes [0, 4) belong to no tensor");
  }
  SECTION("unused bytes at the end") {
    expect_error(st_bytes(obj({entry("a", "F32", "[1]", 0, 4)}), d8), "bytes [4, 8) at the end belong to no tensor");
  }
  SECTION("data but no tensors") { expect_error(st_bytes("{}", d8), "bytes [0, 8) at the end belong to no tensor"); }
}

TEST_CASE("safetensors: missing tensor", "[safetensors][errors]") {
  auto f = load(st_bytes(obj({entry("x", "F32", "[1]", 0, 4)}), f32_bytes({1})), "w.safetensors");
  CHECK_FALSE(f->has("y"));
  CHECK_THROWS_AS(f->get("y"), g3::InputError);
  CHECK_THROWS_WITH(f->get("y"), "w.safetensors: missing tensor y");
}

TEST_CASE("safetensors: open() errors name the path", "[safetensors][errors]") {
  g3test::TempDir dir;
  SECTION("missing file") {
    std::string p = dir.file("none.safetensors");
    CHECK_THROWS_WITH(g3::SafeTensorsFile::open(p), p + ": cannot open (No such file or directory)");
  }
  SECTION("empty file") {
    std::string p = dir.file("empty.safetensors");
    g3test::write_bytes(p, {});
    CHECK_THROWS_AS(g3::SafeTensorsFile::open(p), g3::InputError);
    CHECK_THROWS_WITH(g3::SafeTensorsFile::open(p), Contains(p + ": ") && Contains("file is empty"));
  }
  SECTION("a directory") {
    CHECK_THROWS_WITH(g3::SafeTensorsFile::open(dir.path), Contains(dir.path + ": ") && Contains("directory"));
  }
  SECTION("a .npy file") {
    std::string p = g3test::golden_file(kGoldenCase, "x.npy");
    CHECK_THROWS_WITH(g3::SafeTensorsFile::open(p), Contains(p + ": ") && Contains("header length"));
  }
  SECTION("invalid header through a mapped file") {
    std::string p = dir.file("bad.safetensors");
    g3test::write_bytes(p, st_bytes(obj({entry("a", "F32", "[1]", 0, 4)}), f32_bytes({1, 2})));
    CHECK_THROWS_WITH(g3::SafeTensorsFile::open(p), Contains(p + ": ") && Contains("at the end belong to no tensor"));
  }
}
