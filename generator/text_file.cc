#include "generator/text_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "generator/errors.h"

namespace g3 {

namespace {

std::string mib(size_t bytes) {
  return bytes % (size_t{1} << 20) == 0 ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes) + " bytes";
}

}  // namespace

std::string read_text_file(const std::string& path, size_t max_bytes) {
  // errno is read into `e` before any string is built around it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    throw InputError(path + ": cannot open (" + std::strerror(e) + ")");
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st = {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    throw InputError(path + ": cannot stat (" + std::strerror(e) + ")");
  }
  if (S_ISDIR(st.st_mode)) throw InputError(path + ": is a directory");
  const std::string too_large = path + ": is larger than " + mib(max_bytes);
  if (S_ISREG(st.st_mode) && uint64_t(st.st_size) > max_bytes) throw InputError(too_large);
  // Pipes and devices have no size to check first: read until the end or
  // one byte past the bound.
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      throw InputError(path + ": cannot read (" + std::strerror(e) + ")");
    }
    if (n == 0) break;
    if (text.size() + size_t(n) > max_bytes) throw InputError(too_large);
    text.append(buf, size_t(n));
  }
  return text;
}

}  // namespace g3
