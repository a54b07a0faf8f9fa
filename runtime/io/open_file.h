// Opening an input file as every reader of runtime/io/ reports it: the path,
// what failed and the system's reason, on one line.
#pragma once
#include <string>
#include <sys/stat.h>

namespace g3 {

struct OpenFile {
  int fd = -1;          // read-only, close-on-exec; the caller closes it
  struct stat st = {};  // what fstat said about it
};

// Opens and stats `path`; InputError "<path>: cannot open (<reason>)" or
// "<path>: cannot stat (<reason>)" otherwise (the descriptor is closed).
OpenFile open_for_reading(const std::string& path);

}  // namespace g3
