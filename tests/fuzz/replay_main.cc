// Replay runner: the main() a fuzz harness gets when it is not linked with
// libFuzzer (any compiler, every build). It feeds the harness every file
// under the directories or files named on the command line, so CTest can
// check the seed corpus and every past crash input on each build. A bug
// aborts inside the harness; this runner names the input first so the
// failure points at the file.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR|FILE...  (runs the fuzz harness once per input file)\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    fs::path p = argv[i];
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(p)) {
        // Dot files (.gitkeep) and README files document the directory and are not inputs.
        std::string name = e.path().filename().string();
        if (e.is_regular_file() && name[0] != '.' && name.rfind("README", 0) != 0) inputs.push_back(e.path());
      }
    } else if (fs::is_regular_file(p, ec)) {
      inputs.push_back(p);
    } else {
      std::fprintf(stderr, "%s: no such file or directory\n", argv[i]);
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  for (const fs::path& p : inputs) {
    std::ifstream f(p, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!f.good() && !f.eof()) {
      std::fprintf(stderr, "%s: cannot read\n", p.c_str());
      return 2;
    }
    std::fprintf(stderr, "replay %s (%zu bytes)\n", p.c_str(), bytes.size());
    // A copy of exactly the file's size, so ASan flags a read one byte past the input.
    std::vector<uint8_t> exact(bytes.begin(), bytes.end());
    // libFuzzer never passes a null pointer, even for an empty input; nor do we.
    static uint8_t empty_input = 0;
    LLVMFuzzerTestOneInput(exact.empty() ? &empty_input : exact.data(), exact.size());
  }
  std::printf("%zu inputs replayed, no bugs\n", inputs.size());
  return 0;
}
