// The .npy reader and writer. The header is a Python dict literal; we parse
// the small subset NumPy writes (strings, True/False, tuples of integers) by
// hand with a tiny recursive-descent parser, so anything outside that subset
// is rejected with a message instead of being half-understood.
#include "runtime/io/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string_view>

#include "generator/errors.h"
#include "runtime/io/open_file.h"

namespace g3 {

// Element data is copied byte for byte into float/int32 vectors, which is
// only correct on a little-endian host. Every target we build for is.
static_assert(std::endian::native == std::endian::little, "g3attn assumes a little-endian host");

namespace {

constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
// Arrays above 2^40 elements (4 TiB of float32) cannot be meant seriously;
// rejecting them before allocating keeps a crafted header from exhausting memory.
constexpr uint64_t kMaxElements = uint64_t{1} << 40;

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw InputError(name + ": " + what);
}

// Quotes a piece of the header for an error message, keeping it on one line
// and short even when the header is garbage.
std::string show(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40)) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
  if (s.size() > 40) out += "...";
  return out;
}

// The fields we need from the header dict.
struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

// Recursive-descent parser for the header dict. Python's literal syntax
// allows more than this (escapes, nested containers, numbers in other bases),
// but NumPy never writes those for the dtypes we accept, so they are errors.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : s_(text), name_(name) {}

  Header parse() {
    Header h;
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    skip_ws();
    expect('{');
    skip_ws();
    while (!at('}')) {
      std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (seen_descr) bad("key 'descr' appears twice");
        seen_descr = true;
        if (!at('\'') && !at('"')) bad("'descr' must be a string such as '<f4' (structured dtypes are not supported)");
        h.descr = parse_string();
      } else if (key == "fortran_order") {
        if (seen_fortran) bad("key 'fortran_order' appears twice");
        seen_fortran = true;
        h.fortran_order = parse_bool();
      } else if (key == "shape") {
        if (seen_shape) bad("key 'shape' appears twice");
        seen_shape = true;
        h.shape = parse_shape();
      } else {
        bad("unexpected key '" + show(key) + "' (expected 'descr', 'fortran_order', 'shape')");
      }
      skip_ws();
      // A comma separates entries and may also trail the last one, as NumPy writes it.
      if (at(',')) {
        ++pos_;
        skip_ws();
      } else if (!at('}')) {
        bad_here("expected ',' or '}'");
      }
    }
    ++pos_;  // the closing brace
    skip_ws();
    if (pos_ != s_.size()) bad_here("unexpected text after the closing '}'");
    if (!seen_descr) bad("key 'descr' is missing");
    if (!seen_fortran) bad("key 'fortran_order' is missing");
    if (!seen_shape) bad("key 'shape' is missing");
    return h;
  }

 private:
  [[noreturn]] void bad(const std::string& what) { fail(name_, "malformed .npy header: " + what); }
  [[noreturn]] void bad_here(const std::string& what) {
    if (pos_ >= s_.size()) bad(what + " but the header ended");
    bad(what + " at '" + show(s_.substr(pos_)) + "'");
  }

  bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  void expect(char c) {
    if (!at(c)) bad_here(std::string("expected '") + c + "'");
    ++pos_;
  }
  // NumPy pads the header with spaces and ends it with '\n'; tabs and
  // carriage returns are tolerated as other writers may use them.
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r')) ++pos_;
  }

  std::string parse_string() {
    if (!at('\'') && !at('"')) bad_here("expected a quoted string");
    char quote = s_[pos_++];
    size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      // Escapes never occur in the keys or dtype strings we accept, so a
      // backslash means the header is something we do not understand.
      if (s_[pos_] == '\\') bad("escape sequences in strings are not supported");
      if (s_[pos_] == '\n') bad("unterminated string");
      ++pos_;
    }
    if (pos_ >= s_.size()) bad("unterminated string");
    std::string out(s_.substr(start, pos_ - start));
    ++pos_;
    return out;
  }

  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    bad_here("'fortran_order' must be True or False");
  }

  // A tuple of non-negative decimal integers: (), (3,), (2, 3) or (2, 3,).
  // "(3)" is the integer 3 in Python, not a tuple, and NumPy rejects it too.
  std::vector<int64_t> parse_shape() {
    std::vector<int64_t> shape;
    if (!at('(')) bad_here("'shape' must be a tuple such as (2, 3)");
    ++pos_;
    skip_ws();
    bool trailing_comma = false;
    while (!at(')')) {
      shape.push_back(parse_dim());
      skip_ws();
      trailing_comma = false;
      if (at(',')) {
        ++pos_;
        trailing_comma = true;
        skip_ws();
      } else if (!at(')')) {
        bad_here("expected ',' or ')' in 'shape'");
      }
    }
    ++pos_;
    if (shape.size() == 1 && !trailing_comma) bad("'shape' (" + std::to_string(shape[0]) + ") is not a tuple; a 1-d shape is written (" + std::to_string(shape[0]) + ",)");
    return shape;
  }

  int64_t parse_dim() {
    if (at('-')) bad("'shape' has a negative dimension");
    if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') bad_here("expected a dimension (a non-negative integer) in 'shape'");
    uint64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      v = v * 10 + static_cast<uint64_t>(s_[pos_] - '0');
      // Stop before the value can overflow; the element limit catches it anyway.
      if (v > kMaxElements) bad("'shape' has a dimension larger than 2^40");
      ++pos_;
    }
    // Python 2 era writers appended L to longs; NumPy itself never did for
    // shapes it writes today, so treat it like any other unexpected text.
    return static_cast<int64_t>(v);
  }

  std::string_view s_;
  const std::string& name_;
  size_t pos_ = 0;
};

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

const char* dtype_label(NpyArray::Type t) { return t == NpyArray::Type::F32 ? "float32 ('<f4')" : "int32 ('<i4')"; }

std::string shape_to_python(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// What a .npy header says: the array's type and shape, where its data starts
// and how many bytes that data is.
struct Layout {
  NpyArray::Type type = NpyArray::Type::F32;
  std::vector<int64_t> shape;
  size_t data_start = 0;
  uint64_t data_bytes = 0;
};

// The layout from the first `size` bytes of a file. Bytes that cannot begin
// a supported .npy file are refused at once; a header not complete yet is
// refused as truncated when the bytes are the whole file (`whole`), and
// gives nullopt otherwise (slurp, still reading).
std::optional<Layout> read_layout(const uint8_t* data, size_t size, const std::string& name, bool whole) {
  if (size < 6 && !whole) return std::nullopt;
  if (size < 6 || std::memcmp(data, kMagic, 6) != 0) fail(name, "not a .npy file (bad magic)");
  auto truncated = [&](const std::string& why) -> std::optional<Layout> {
    if (!whole) return std::nullopt;
    fail(name, "truncated .npy file (" + why + ")");
  };
  const std::string too_short = std::to_string(size) + " bytes, too short for a header";
  if (size < 10) return truncated(too_short);
  const uint8_t major = data[6], minor = data[7];
  size_t header_start = 0, header_len = 0;
  if (major == 1 && minor == 0) {
    header_len = load_u16(data + 8);
    header_start = 10;
  } else if ((major == 2 || major == 3) && minor == 0) {
    if (size < 12) return truncated(too_short);
    header_len = load_u32(data + 8);
    header_start = 12;
  } else {
    fail(name, ".npy format version " + std::to_string(major) + "." + std::to_string(minor) + " is not supported (need 1.0, 2.0 or 3.0)");
  }
  if (header_len > size - header_start)
    return truncated("header length " + std::to_string(header_len) + " but only " + std::to_string(size - header_start) + " bytes follow");

  std::string_view text(reinterpret_cast<const char*>(data + header_start), header_len);
  Header h = HeaderParser(text, name).parse();

  Layout l;
  if (h.descr == "<f4") {
    l.type = NpyArray::Type::F32;
  } else if (h.descr == "<i4") {
    l.type = NpyArray::Type::I32;
  } else {
    fail(name, "dtype '" + show(h.descr) + "' is not supported (need little-endian float32 '<f4' or int32 '<i4')");
  }
  if (h.fortran_order) fail(name, "Fortran order not supported (save the array in C order, e.g. np.ascontiguousarray)");

  uint64_t n = 1;
  for (int64_t d : h.shape) {
    uint64_t u = static_cast<uint64_t>(d);
    if (u != 0 && n > kMaxElements / u) fail(name, "shape " + shape_to_python(h.shape) + " is absurdly large (more than 2^40 elements)");
    n *= u;
  }
  if (n > kMaxElements) fail(name, "shape " + shape_to_python(h.shape) + " is absurdly large (more than 2^40 elements)");
  l.shape = std::move(h.shape);
  l.data_start = header_start + header_len;
  l.data_bytes = n * 4;
  return l;
}

// Reads a whole file into memory. Its header is checked as soon as it has
// arrived, so bytes that are not a .npy file are refused at once; and a pipe
// or device (no size to trust) is read no further than the header says the
// file holds: one that never ends (/dev/zero) is refused instead of being
// read until memory runs out. The messages follow the rest of the tool:
// "<path>: cannot open (<reason>)".
std::vector<uint8_t> slurp(const std::string& path) {
  const OpenFile file = open_for_reading(path);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{file.fd};
  const bool regular = S_ISREG(file.st.st_mode);
  if (S_ISDIR(file.st.st_mode)) fail(path, "is a directory, not a .npy file");
  std::vector<uint8_t> out;
  if (regular && file.st.st_size > 0) out.reserve(static_cast<size_t>(file.st.st_size));
  bool header_seen = false;
  uint64_t limit = UINT64_MAX;  // a pipe's or device's bytes past the header's need
  uint8_t buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(file.fd, buf, sizeof buf);
    if (n < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      fail(path, std::string("cannot read (") + std::strerror(e) + ")");
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
    if (!header_seen)
      if (const std::optional<Layout> l = read_layout(out.data(), out.size(), path, /*whole=*/false)) {
        header_seen = true;
        if (!regular) limit = l->data_start + l->data_bytes;
      }
    if (out.size() > limit)
      fail(path, "trailing data: the header and shape need " + std::to_string(limit) +
                     " bytes but the stream goes on past them");
  }
  return out;
}

std::vector<uint8_t> npy_bytes(const char* descr, const void* data, const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw InputError("cannot serialise .npy: negative dimension " + std::to_string(d) + " in shape " + shape_to_python(shape));
    if (d != 0 && n > kMaxElements / static_cast<uint64_t>(d)) throw InputError("cannot serialise .npy: shape " + shape_to_python(shape) + " is too large");
    n *= static_cast<uint64_t>(d);
  }
  // A 0-d array still holds one element, so only an empty shape may come without data.
  if (n != 0 && data == nullptr) throw InputError("cannot serialise .npy: no data for shape " + shape_to_python(shape));
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape_to_python(shape) + ", }";
  // NumPy pads so that magic + version + length + header is a multiple of 64,
  // which keeps the data aligned when the file is memory-mapped.
  size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  if (header.size() > 0xffff) throw InputError("cannot serialise .npy: header too long for format version 1.0");
  std::vector<uint8_t> out(10 + header.size() + n * 4);
  std::memcpy(out.data(), kMagic, 6);
  out[6] = 1;  // format version 1.0
  out[7] = 0;
  out[8] = static_cast<uint8_t>(header.size() & 0xff);
  out[9] = static_cast<uint8_t>(header.size() >> 8);
  std::memcpy(out.data() + 10, header.data(), header.size());
  if (n) std::memcpy(out.data() + 10 + header.size(), data, n * 4);
  return out;
}

}  // namespace

int64_t NpyArray::size() const {
  // Zero first, so the product of the other dimensions never overflows.
  for (int64_t d : shape)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

NpyArray parse_npy(const uint8_t* data, size_t size, const std::string& name) {
  Layout l = *read_layout(data, size, name, /*whole=*/true);
  const uint64_t have = size - l.data_start, want = l.data_bytes, n = want / 4;
  if (have < want) fail(name, "truncated data: shape " + shape_to_python(l.shape) + " needs " + std::to_string(want) + " bytes but the file has " + std::to_string(have));
  if (have > want) fail(name, "trailing data: shape " + shape_to_python(l.shape) + " needs " + std::to_string(want) + " bytes but the file has " + std::to_string(have));

  NpyArray arr;
  arr.type = l.type;
  arr.shape = std::move(l.shape);
  if (arr.type == NpyArray::Type::F32) {
    arr.f32.resize(n);
    if (n) std::memcpy(arr.f32.data(), data + l.data_start, want);
  } else {
    arr.i32.resize(n);
    if (n) std::memcpy(arr.i32.data(), data + l.data_start, want);
  }
  return arr;
}

NpyArray read_npy(const std::string& path) {
  std::vector<uint8_t> bytes = slurp(path);
  return parse_npy(bytes.data(), bytes.size(), path);
}

static NpyArray read_npy_as(const std::string& path, NpyArray::Type want) {
  NpyArray a = read_npy(path);
  if (a.type != want) fail(path, std::string("expected ") + dtype_label(want) + " but found " + dtype_label(a.type));
  return a;
}

NpyArray read_npy_f32(const std::string& path) { return read_npy_as(path, NpyArray::Type::F32); }
NpyArray read_npy_i32(const std::string& path) { return read_npy_as(path, NpyArray::Type::I32); }

std::vector<uint8_t> npy_bytes_f32(const float* data, const std::vector<int64_t>& shape) {
  return npy_bytes("<f4", data, shape);
}
std::vector<uint8_t> npy_bytes_i32(const int32_t* data, const std::vector<int64_t>& shape) {
  return npy_bytes("<i4", data, shape);
}

namespace {

// All of `bytes` to an open descriptor; errno of the failing write, or 0.
int write_all(int fd, const std::vector<uint8_t>& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<size_t>(n);
  }
  return 0;
}

}  // namespace

void write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes) {
  // Something that is not a file and not a directory (a device, a FIFO,
  // /dev/stdout) has nothing to replace: it is written in place. A rename
  // would replace the node itself (`--json /dev/full`, run as root, left a
  // regular file where the device had been).
  struct stat st = {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    int err = fd < 0 ? errno : write_all(fd, bytes);
    if (fd >= 0 && ::close(fd) != 0 && err == 0) err = errno;
    if (err) throw InputError("cannot write " + path + ": " + std::strerror(err));
    return;
  }
  // A symlink is followed: the file it names is replaced, the link stays.
  std::string target = path;
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    std::error_code ec;
    const std::filesystem::path real = std::filesystem::weakly_canonical(path, ec);
    if (!ec) target = real.string();
  }
  // The temporary lives beside the target so that rename() stays within one
  // filesystem and is atomic; the dot keeps it out of casual listings.
  std::string dir, base;
  size_t slash = target.rfind('/');
  if (slash == std::string::npos) {
    dir = ".";
    base = target;
  } else {
    dir = slash == 0 ? "/" : target.substr(0, slash);
    base = target.substr(slash + 1);
  }
  if (base.empty()) throw InputError("cannot write " + path + ": " + std::strerror(EISDIR));

  // The pid separates processes; the random part and a counter separate
  // concurrent writers within one process.
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  uint64_t salt = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                  static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^ (counter++ << 48);
  std::string tmp = (dir == "/" ? std::string("/") : dir + "/") + "." + base + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(salt);

  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw InputError("cannot write " + path + ": " + std::strerror(errno));
  auto give_up = [&](int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw InputError("cannot write " + path + ": " + std::strerror(err));
  };
  if (const int err = write_all(fd, bytes)) give_up(err);
  // fsync before rename: otherwise a crash could leave the new name pointing
  // at a file whose data never reached the disk.
  if (::fsync(fd) != 0) give_up(errno);
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0) give_up(errno);
  if (::rename(tmp.c_str(), target.c_str()) != 0) give_up(errno);
  // Persisting the directory entry is best effort: some filesystems refuse
  // to fsync a directory, and the data itself is already safe.
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  write_file_atomic(path, npy_bytes_f32(data, shape));
}

}  // namespace g3
