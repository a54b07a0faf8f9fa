// The safetensors reader. The file is mapped read-only and every number in
// the header is checked against the mapping before a view is handed out, so
// later code can trust TensorView::data/nbytes without re-checking. All reads
// from the mapping go through memcpy: the data section has no alignment
// guarantee and unaligned pointer casts are undefined behaviour.
#include "runtime/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "generator/errors.h"
#include "runtime/io/open_file.h"

namespace g3 {

static_assert(std::endian::native == std::endian::little, "g3attn assumes a little-endian host");

namespace {

using nlohmann::json;

// A header larger than this is not a real checkpoint; refusing it up front
// keeps a crafted length from making us parse (or copy) gigabytes of JSON.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw InputError(name + ": " + what);
}

// Error messages must stay on one line and printable even when they quote
// attacker-controlled bytes (tensor names, JSON parser excerpts).
std::string printable(const std::string& s, size_t max_len = 80) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    unsigned char u = static_cast<unsigned char>(s[i]);
    out += (u >= 0x20 && u < 0x7f) ? s[i] : '?';
  }
  if (s.size() > max_len) out += "...";
  return out;
}

// Quotes a header value in a message without recursing into it: a crafted
// value nested thousands of levels deep must not overflow the stack.
std::string quote_value(const nlohmann::json& v) {
  if (v.is_structured()) return std::string("a JSON ") + v.type_name();
  return printable(v.dump());
}

size_t dtype_size(TensorDType d) { return d == TensorDType::F32 ? 4 : 2; }

// Dtypes named by the safetensors specification that we do not convert. They
// get a "unsupported" message rather than "unknown" so the user knows the
// file is fine and only this tool is limited.
bool is_known_safetensors_dtype(const std::string& s) {
  static const std::set<std::string> known = {"BOOL",    "U8",      "I8",      "F8_E5M2", "F8_E4M3", "F8_E8M0",
                                              "F4",      "F6_E2M3", "F6_E3M2", "I16",     "U16",     "I32",
                                              "U32",     "F64",     "I64",     "U64",     "C64"};
  return known.count(s) != 0;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Accepts a JSON number only if it is a non-negative integer that fits in
// int64; floats such as 1.0 and huge integers (parsed as floats) are refused.
bool as_nonneg_int(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = u;
    return true;
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = static_cast<uint64_t>(i);
    return true;
  }
  return false;
}

// Rejects duplicate keys while parsing. nlohmann keeps the last value of a
// duplicated key silently, which would let one tensor entry hide another.
struct DuplicateKeyCheck {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  bool operator()(int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() && !open_objects.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty())
          duplicate = parsed.get<std::string>();
        break;
      default:
        break;
    }
    return true;
  }
};

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;  // signed zero
    } else {
      // Subnormal half: mant * 2^-24. Shift the mantissa up until its leading
      // one reaches the implicit-bit position; every half subnormal is a
      // normal float, so the result is exact.
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400) == 0);
      mant &= 0x3ff;
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    // Infinity keeps a zero mantissa; NaN keeps its payload (and so stays NaN).
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

const char* to_string(TensorDType d) {
  switch (d) {
    case TensorDType::F32:
      return "F32";
    case TensorDType::BF16:
      return "BF16";
    case TensorDType::F16:
      return "F16";
  }
  return "?";
}

int64_t TensorView::numel() const {
  // A zero dimension is checked first: the other dimensions of an empty
  // tensor may be large enough for their product to overflow.
  for (int64_t d : shape)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> TensorView::to_f32() const {
  size_t n = nbytes / dtype_size(dtype);
  std::vector<float> out(n);
  if (n == 0) return out;
  switch (dtype) {
    case TensorDType::F32:
      std::memcpy(out.data(), data, n * 4);
      break;
    case TensorDType::BF16:
      // bf16 is the top half of an f32, so widening is exact.
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(&out[i], &bits, 4);
      }
      break;
    case TensorDType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
  }
  return out;
}

std::shared_ptr<SafeTensorsFile> SafeTensorsFile::open(const std::string& path) {
  const OpenFile file = open_for_reading(path);
  const int fd = file.fd;
  const struct stat& st = file.st;
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, S_ISDIR(st.st_mode) ? "is a directory, not a safetensors file" : "is not a regular file");
  }
  size_t size = static_cast<size_t>(st.st_size);
  // mmap of zero bytes fails with EINVAL; say what is actually wrong instead.
  if (size == 0) {
    ::close(fd);
    fail(path, "file is empty (not a safetensors file)");
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  // The mapping stays valid after the descriptor is closed.
  ::close(fd);
  if (p == MAP_FAILED) fail(path, std::string("cannot map (") + std::strerror(map_errno) + ")");

  // The constructor is private, so make_shared cannot be used. Once the
  // object owns the mapping, a failed parse unmaps it through the destructor.
  std::shared_ptr<SafeTensorsFile> f(new SafeTensorsFile());
  f->base_ = static_cast<const uint8_t*>(p);
  f->size_ = size;
  f->mapped_ = true;
  f->parse(path);
  return f;
}

std::shared_ptr<SafeTensorsFile> SafeTensorsFile::from_bytes(const uint8_t* data, size_t size, const std::string& name) {
  std::shared_ptr<SafeTensorsFile> f(new SafeTensorsFile());
  if (size) f->owned_.assign(data, data + size);
  f->base_ = f->owned_.data();
  f->size_ = size;
  f->parse(name);
  return f;
}

SafeTensorsFile::~SafeTensorsFile() {
  if (mapped_ && base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

void SafeTensorsFile::parse(const std::string& name) {
  path_ = name;
  if (size_ == 0) fail(name, "file is empty (not a safetensors file)");
  if (size_ < 8)
    fail(name, "file is " + std::to_string(size_) + " bytes, shorter than the 8-byte header length (not a safetensors file)");

  uint64_t header_len;
  std::memcpy(&header_len, base_, 8);
  if (header_len > kMaxHeaderBytes)
    fail(name, "header length " + std::to_string(header_len) + " is absurd (limit " + std::to_string(kMaxHeaderBytes) +
                   " bytes; not a safetensors file?)");
  // Compared as header_len > size - 8 so the check itself cannot overflow.
  if (header_len > size_ - 8)
    fail(name, "header length " + std::to_string(header_len) + " exceeds the file size " + std::to_string(size_));

  const char* hbegin = reinterpret_cast<const char*>(base_ + 8);
  const char* hend = hbegin + header_len;
  json root;
  DuplicateKeyCheck dup;
  try {
    root = json::parse(hbegin, hend, std::ref(dup));
  } catch (const json::exception& e) {
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix; the rest
    // says where and why.
    std::string why = e.what();
    size_t close = why.find("] ");
    if (close != std::string::npos) why = why.substr(close + 2);
    fail(name, "header is not valid JSON (" + printable(why, 160) + ")");
  }
  if (!dup.duplicate.empty()) fail(name, "header has the key '" + printable(dup.duplicate) + "' more than once");
  if (!root.is_object()) fail(name, std::string("header is not a JSON object (found ") + root.type_name() + ")");

  const uint64_t data_size = size_ - 8 - header_len;
  const uint8_t* data_base = base_ + 8 + header_len;

  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;

  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) fail(name, std::string("__metadata__ is not an object (found ") + v.type_name() + ")");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(name, "__metadata__ value for '" + printable(m.key()) + "' is not a string (found " + m.value().type_name() + ")");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }

    const std::string tname = "tensor " + printable(key);
    if (!v.is_object()) fail(name, tname + ": entry is not an object (found " + std::string(v.type_name()) + ")");
    // Keys other than these three are ignored, as the reference reader does.
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end()) fail(name, tname + ": missing \"dtype\"");
    if (sh == v.end()) fail(name, tname + ": missing \"shape\"");
    if (off == v.end()) fail(name, tname + ": missing \"data_offsets\"");

    if (!dt->is_string()) fail(name, tname + ": \"dtype\" is not a string");
    const std::string dts = dt->get<std::string>();
    TensorView view;
    if (dts == "F32") {
      view.dtype = TensorDType::F32;
    } else if (dts == "BF16") {
      view.dtype = TensorDType::BF16;
    } else if (dts == "F16") {
      view.dtype = TensorDType::F16;
    } else if (is_known_safetensors_dtype(dts)) {
      fail(name, tname + " has unsupported dtype " + dts + " (supported: F32, BF16, F16)");
    } else {
      fail(name, tname + " has unknown dtype '" + printable(dts) + "' (supported: F32, BF16, F16)");
    }
    const uint64_t esize = dtype_size(view.dtype);

    if (!sh->is_array()) fail(name, tname + ": \"shape\" is not an array");
    // The byte count is capped at 2^62 while multiplying so that it cannot
    // overflow; anything that large cannot match a real byte span anyway.
    const uint64_t max_numel = (uint64_t{1} << 62) / esize;
    uint64_t numel = 1;
    bool too_big = false;
    for (const json& d : *sh) {
      uint64_t u;
      if (!as_nonneg_int(d, &u)) fail(name, tname + ": \"shape\" must hold non-negative integers below 2^63, found " + quote_value(d));
      view.shape.push_back(static_cast<int64_t>(u));
      if (!too_big && u != 0 && numel > max_numel / u) too_big = true;
      if (!too_big) numel *= u;
    }
    // A zero dimension makes the tensor empty however large the others are.
    if (std::find(view.shape.begin(), view.shape.end(), 0) != view.shape.end()) {
      too_big = false;
      numel = 0;
    }

    if (!off->is_array() || off->size() != 2) fail(name, tname + ": \"data_offsets\" must be an array [begin, end]");
    uint64_t begin, end;
    if (!as_nonneg_int((*off)[0], &begin) || !as_nonneg_int((*off)[1], &end))
      fail(name, tname + ": \"data_offsets\" must hold non-negative integers below 2^63, found " + quote_value(*off));
    if (begin > end)
      fail(name, tname + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] has begin after end");
    if (end > data_size)
      fail(name, tname + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     "] run past the end of the data section (" + std::to_string(data_size) + " bytes)");
    const std::string span = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] span " +
                             std::to_string(end - begin) + " bytes";
    if (too_big)
      fail(name, tname + ": shape " + shape_str(view.shape) + " x " + dts + " needs more than 2^62 bytes but " + span);
    if (numel * esize != end - begin)
      fail(name, tname + ": shape " + shape_str(view.shape) + " x " + dts + " needs " + std::to_string(numel * esize) +
                     " bytes but " + span);

    view.name = key;
    view.data = data_base + begin;
    view.nbytes = static_cast<size_t>(end - begin);
    auto ins = tensors_.emplace(key, std::move(view));
    spans.push_back({begin, end, &ins.first->first});
  }

  // The specification requires the tensors to tile the data section exactly:
  // sorted by begin, each starts where the previous ended, from 0 to the end.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const std::string* prev = nullptr;
  for (const Span& s : spans) {
    if (s.begin < covered)
      fail(name, "tensors " + printable(*prev) + " and " + printable(*s.name) + " overlap (" + printable(*prev) + " ends at byte " +
                     std::to_string(covered) + ", " + printable(*s.name) + " begins at byte " + std::to_string(s.begin) + ")");
    if (s.begin > covered)
      fail(name, "gap in the data section: bytes [" + std::to_string(covered) + ", " + std::to_string(s.begin) +
                     ") belong to no tensor (before tensor " + printable(*s.name) + ")");
    covered = s.end;
    prev = s.name;
  }
  if (covered != data_size)
    fail(name, "gap in the data section: bytes [" + std::to_string(covered) + ", " + std::to_string(data_size) +
                   ") at the end belong to no tensor");
}

bool SafeTensorsFile::has(const std::string& name) const { return tensors_.count(name) != 0; }

const TensorView& SafeTensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail(path_, "missing tensor " + printable(name));
  return it->second;
}

const std::vector<std::string>& hf_layer_prefixes() {
  static const std::vector<std::string> prefixes = {"model.layers.", "model.language_model.layers.",
                                                    "language_model.model.layers."};
  return prefixes;
}

}  // namespace g3
