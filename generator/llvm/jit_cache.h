// The on-disk cache of JIT-compiled objects: bytes in, bytes out.
// It knows nothing of LLVM; the LLVM backend hands it the text that
// identifies an object (kernel key, target CPU and features, LLVM version,
// ISA cap, generator version) and the object's bytes.
//
// Layout: one file per entry, named by a 64-bit FNV-1a hash of the identity
// text ("<16 hex digits>.g3o"), in $G3ATTN_CACHE_DIR, else
// $XDG_CACHE_HOME/g3attn, else ~/.cache/g3attn. Each file starts with a
// header (magic, format version, lengths, checksum) followed by the identity
// text and the payload, so a truncated, garbage or colliding file is detected
// and treated as a miss. Entries are written to a temporary file in the same
// directory and renamed into place, so readers never see a partial entry and
// two writers of the same key leave one valid file.
//
// Failure policy: the cache is an optimisation and never a reason to fail.
// A corrupt entry is reported with "g3attn: warning: ..." on stderr and
// ignored (the caller recompiles and overwrites it); a directory that cannot
// be created or written disables storing, with one warning.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace g3 {

// FNV-1a, 64 bit: the entry name and the payload checksum.
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

// The directory the environment asks for (G3ATTN_CACHE_DIR, XDG_CACHE_HOME,
// HOME, in that order), or "" when none of them is set.
std::string default_jit_cache_dir();

class JitCache {
 public:
  // Entry format version; bump when the header layout changes.
  static constexpr uint32_t kFormatVersion = 1;

  // Opens (creating if needed) `dir`; never throws. An empty `dir` or one
  // that cannot be created gives a disabled cache (a warning is printed for
  // the latter).
  explicit JitCache(std::string dir);
  // The process-wide cache at default_jit_cache_dir(), opened on first use.
  static JitCache& process_default();

  bool can_read() const { return readable_; }
  bool can_write() const;
  const std::string& dir() const { return dir_; }

  // The file an identity maps to (whether or not it exists).
  std::string entry_path(const std::string& identity) const;
  // The payload stored for `identity`, or nullopt on a miss. A file that
  // exists but fails validation (short, bad magic/version, wrong identity,
  // checksum mismatch) gives a warning and nullopt.
  std::optional<std::vector<uint8_t>> load(const std::string& identity);
  // Stores atomically; returns false (after a warning, once) when the
  // directory cannot be written, and then stops trying.
  bool store(const std::string& identity, const void* data, size_t n);

  // Serialises one entry (header + identity + payload) and checks one; both
  // exposed so tests can build corrupt files and the format stays in one place.
  static std::vector<uint8_t> encode(const std::string& identity, const void* data, size_t n);
  // On failure returns nullopt and sets *why.
  static std::optional<std::vector<uint8_t>> decode(const std::string& identity, const std::vector<uint8_t>& file,
                                                    std::string* why);

 private:
  void warn_once_unwritable(const std::string& why);
  std::string dir_;
  bool readable_ = false;
  mutable std::mutex mu_;
  bool writable_ = false;
  bool warned_ = false;
};

}  // namespace g3
