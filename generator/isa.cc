#include "generator/backend_api.h"

namespace g3 {

const std::vector<std::string>& isa_names() {
  static const std::vector<std::string> names = {"scalar", "ssse3", "sse4", "avx2", "avx3", "avx3_dl"};
  return names;
}

}  // namespace g3
