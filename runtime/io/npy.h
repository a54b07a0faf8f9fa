// The .npy format (NumPy format versions 1.0, 2.0 and 3.0): reader and writer
// for little-endian float32 and int32 arrays in C order. Anything else is a
// clear InputError naming the file. Debian has no library for it, so this is
// ours: small and strict.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace g3 {

struct NpyArray {
  enum class Type { F32, I32 };
  Type type = Type::F32;
  std::vector<int64_t> shape;
  std::vector<float> f32;    // filled when type == F32
  std::vector<int32_t> i32;  // filled when type == I32
  int64_t size() const;      // product of shape (1 for a 0-d array)
};

// Parses bytes already in memory; `name` is used in error messages.
NpyArray parse_npy(const uint8_t* data, size_t size, const std::string& name);
NpyArray read_npy(const std::string& path);
// Read and require a dtype; message names the file and what was found.
NpyArray read_npy_f32(const std::string& path);
NpyArray read_npy_i32(const std::string& path);

// Serialises a version 1.0 file ('<f4' or '<i4', fortran_order False).
std::vector<uint8_t> npy_bytes_f32(const float* data, const std::vector<int64_t>& shape);
std::vector<uint8_t> npy_bytes_i32(const int32_t* data, const std::vector<int64_t>& shape);

// Writes atomically: a temporary file in the same directory, fsync, rename
// (through a symlink: beside its target, which is replaced). On any failure
// the temporary file is removed and InputError is thrown. A path that is
// neither a file nor a directory (a device, a FIFO, /dev/stdout) is written
// in place: there is nothing to replace.
void write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes);
void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);

}  // namespace g3
