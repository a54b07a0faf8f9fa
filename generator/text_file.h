// Reading a small text input (a config.json, a checkpoint's index, a profile,
// an earlier bench's JSON) whole, with a bound: a hostile path (a directory,
// /dev/zero, a FIFO that never ends, a file of gigabytes) is refused with one
// clear line instead of being read until memory runs out.
#pragma once
#include <cstddef>
#include <string>

namespace g3 {

// The bytes of `path`, at most max_bytes of them. InputError
// "<path>: <reason>": cannot open / cannot read (the system's reason), is a
// directory, or is larger than the bound (a regular file by its size before
// reading; a pipe or device once the bound is passed).
std::string read_text_file(const std::string& path, size_t max_bytes);

}  // namespace g3
