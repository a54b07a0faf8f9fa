#include "runtime/io/open_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "generator/errors.h"

namespace g3 {

OpenFile open_for_reading(const std::string& path) {
  OpenFile f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) throw InputError(path + ": cannot open (" + std::strerror(errno) + ")");
  if (::fstat(f.fd, &f.st) != 0) {
    const int e = errno;
    ::close(f.fd);
    throw InputError(path + ": cannot stat (" + std::strerror(e) + ")");
  }
  return f;
}

}  // namespace g3
