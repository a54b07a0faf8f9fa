#include "generator/llvm/jit_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace fs = std::filesystem;

namespace g3 {

namespace {

// Header of one entry, little-endian as written by this (x86-64 only) host.
// The checksum covers the identity text and the payload, so a flipped bit
// anywhere after the header is caught, and a file cut short fails the
// length check before the checksum is even computed.
constexpr char kMagic[8] = {'G', '3', 'J', 'I', 'T', 'O', 'B', 'J'};
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t identity_len;
  uint64_t payload_len;
  uint64_t checksum;
};
static_assert(sizeof(Header) == 32, "header layout is part of the file format");

void warn(const std::string& msg) { std::fprintf(stderr, "g3attn: warning: %s\n", msg.c_str()); }

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool write_all(int fd, const uint8_t* p, size_t n, int* err) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_file(const std::string& path, std::vector<uint8_t>* out, bool* exists) {
  *exists = false;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  *exists = true;
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return false;
  }
  out->resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out->size()) {
    ssize_t r = ::read(fd, out->data() + got, out->size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  out->resize(got);
  ::close(fd);
  return true;
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string default_jit_cache_dir() {
  const char* e = std::getenv("G3ATTN_CACHE_DIR");
  if (e && *e) return e;
  e = std::getenv("XDG_CACHE_HOME");
  if (e && *e) return std::string(e) + "/g3attn";
  e = std::getenv("HOME");
  if (e && *e) return std::string(e) + "/.cache/g3attn";
  return "";
}

JitCache::JitCache(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) return;  // no cache asked for, nothing to warn about
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_, ec)) {
    warn("cannot create the kernel cache directory " + dir_ + " (" +
         (ec ? ec.message() : std::string("not a directory")) + "); running without a cache");
    warned_ = true;
    return;
  }
  readable_ = true;
  // Writability is found out by the first store: access(W_OK) lies for root
  // and for full disks, so only a real write tells.
  writable_ = true;
}

JitCache& JitCache::process_default() {
  static JitCache cache(default_jit_cache_dir());
  return cache;
}

bool JitCache::can_write() const {
  std::lock_guard<std::mutex> lock(mu_);
  return writable_;
}

std::string JitCache::entry_path(const std::string& identity) const {
  return dir_ + "/" + hex64(fnv1a64(identity.data(), identity.size())) + ".g3o";
}

std::vector<uint8_t> JitCache::encode(const std::string& identity, const void* data, size_t n) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kFormatVersion;
  h.identity_len = static_cast<uint32_t>(identity.size());
  h.payload_len = n;
  h.checksum = fnv1a64(data, n, fnv1a64(identity.data(), identity.size()));
  std::vector<uint8_t> out(sizeof h + identity.size() + n);
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + sizeof h, identity.data(), identity.size());
  if (n) std::memcpy(out.data() + sizeof h + identity.size(), data, n);
  return out;
}

std::optional<std::vector<uint8_t>> JitCache::decode(const std::string& identity, const std::vector<uint8_t>& file,
                                                     std::string* why) {
  Header h;
  if (file.size() < sizeof h) {
    *why = "shorter than its header (" + std::to_string(file.size()) + " bytes)";
    return std::nullopt;
  }
  std::memcpy(&h, file.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
    *why = "bad magic";
    return std::nullopt;
  }
  if (h.version != kFormatVersion) {
    *why = "format version " + std::to_string(h.version) + ", expected " + std::to_string(kFormatVersion);
    return std::nullopt;
  }
  if (uint64_t(file.size()) != sizeof h + uint64_t(h.identity_len) + h.payload_len) {
    *why = "truncated or padded (" + std::to_string(file.size()) + " bytes, header says " +
           std::to_string(sizeof h + uint64_t(h.identity_len) + h.payload_len) + ")";
    return std::nullopt;
  }
  const uint8_t* id = file.data() + sizeof h;
  const uint8_t* payload = id + h.identity_len;
  if (h.identity_len != identity.size() || std::memcmp(id, identity.data(), identity.size()) != 0) {
    *why = "belongs to another kernel (hash collision or stale entry)";
    return std::nullopt;
  }
  if (fnv1a64(payload, h.payload_len, fnv1a64(id, h.identity_len)) != h.checksum) {
    *why = "checksum mismatch";
    return std::nullopt;
  }
  return std::vector<uint8_t>(payload, payload + h.payload_len);
}

std::optional<std::vector<uint8_t>> JitCache::load(const std::string& identity) {
  if (!readable_) return std::nullopt;
  const std::string path = entry_path(identity);
  std::vector<uint8_t> file;
  bool exists = false;
  if (!read_file(path, &file, &exists)) {
    if (exists) warn("cannot read kernel cache entry " + path + "; recompiling");
    return std::nullopt;
  }
  std::string why;
  auto payload = decode(identity, file, &why);
  if (!payload) warn("kernel cache entry " + path + " is invalid (" + why + "); recompiling");
  return payload;
}

void JitCache::warn_once_unwritable(const std::string& why) {
  writable_ = false;
  if (warned_) return;
  warned_ = true;
  warn("cannot write to the kernel cache directory " + dir_ + " (" + why + "); running without a cache");
}

bool JitCache::store(const std::string& identity, const void* data, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!writable_) return false;
  const std::string path = entry_path(identity);
  std::vector<uint8_t> bytes = encode(identity, data, n);
  // The temporary lives in the same directory so rename() is atomic; its
  // unique name lets concurrent writers (threads or processes) never share one.
  std::string tmp = path + ".tmp-XXXXXX";
  int fd = ::mkstemps(tmp.data(), 0);
  if (fd < 0) {
    warn_once_unwritable(std::strerror(errno));
    return false;
  }
  int err = 0;
  bool ok = write_all(fd, bytes.data(), bytes.size(), &err);
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok) ::chmod(tmp.c_str(), 0644);  // mkstemp makes 0600; readable like any cache file
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    warn_once_unwritable(std::strerror(err));
    return false;
  }
  return true;
}

}  // namespace g3
