// Error types shared by every room of g3attn.
#pragma once
#include <stdexcept>
#include <string>

namespace g3 {

// Bad input from a user: a flag, a file, a config value. The `g3attn` command
// prints what() as one line on stderr and exits with code 2, so the message
// must name the file or flag and say what is wrong.
struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace g3
