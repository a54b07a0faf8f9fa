// libg3attn.so as an engine receives it: its dynamic symbol table holds the
// C API and nothing else, and `cmake --install` gives a prefix in which the
// examples build with find_package(g3attn CONFIG) and with pkg-config, run,
// and print the same block outputs as the installed `g3attn apply` on the
// same input. Not in the sanitizer stage (the API is sanitised by the other
// api suites); in a sanitized build (test.sh --sanitize-all runs every test)
// the examples are instrumented too, since an uninstrumented program cannot
// load an instrumented library.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "runtime/io/npy.h"
#include "tests/support/test_support.h"

namespace fs = std::filesystem;

namespace {

std::string q(const std::string& s) { return "'" + s + "'"; }

#ifdef G3ATTN_TEST_SANITIZED
const std::string kSanitize = " -fsanitize=address,undefined";
#else
const std::string kSanitize;
#endif

// Every function of include/g3attn/g3attn.h.
const char* kApi[] = {
    "g3attn_version", "g3attn_abi_version", "g3attn_last_error", "g3attn_status_name",
    "g3attn_model_builtin", "g3attn_model_from_json", "g3attn_model_load", "g3attn_model_free",
    "g3attn_model_get_info", "g3attn_model_layer", "g3attn_model_layer_key", "g3attn_options_create",
    "g3attn_options_free", "g3attn_options_set_backend", "g3attn_options_set_isa", "g3attn_options_set_kv_dtype",
    "g3attn_options_set_compute", "g3attn_options_set_projections", "g3attn_options_set_threads", "g3attn_context_create", "g3attn_context_free",
    "g3attn_context_get_info", "g3attn_weights_open", "g3attn_model_from_weights", "g3attn_weights_random",
    "g3attn_weights_from_tensors", "g3attn_weights_free", "g3attn_weights_read", "g3attn_layer_create",
    "g3attn_layer_create_heads", "g3attn_layer_free", "g3attn_layer_describe", "g3attn_cache_slots",
    "g3attn_cache_create", "g3attn_cache_wrap", "g3attn_cache_reset", "g3attn_cache_free",
    "g3attn_cache_row", "g3attn_cache_bytes", "g3attn_block", "g3attn_decode",
    "g3attn_attention", "g3attn_finish", "g3attn_kernels_for_key"};

g3test::CmdResult sh(const std::string& cmd) {
  g3test::CmdResult r = g3test::run_shell(cmd);
  INFO("$ " << cmd << "\nexit " << r.exit_code << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err);
  REQUIRE(r.exit_code == 0);
  return r;
}

// An int32 .npy (the runtime writes only float32 ones): format 1.0, the
// header padded with spaces to a multiple of 64 bytes, ending in a newline.
void write_npy_i32(const std::string& path, const std::vector<int32_t>& v, const std::vector<int64_t>& shape) {
  std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (";
  for (int64_t d : shape) dict += std::to_string(d) + ", ";
  dict += "), }";
  while ((10 + dict.size() + 1) % 64) dict += ' ';
  dict += '\n';
  std::string head = "\x93NUMPY";
  head += char(1);
  head += char(0);
  head += char(dict.size() & 0xff);
  head += char(dict.size() >> 8);
  std::ofstream f(path, std::ios::binary);
  f << head << dict;
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(int32_t)));
}

std::vector<float> read_raw(const std::string& path) {
  const std::vector<uint8_t> b = g3test::read_bytes(path);
  std::vector<float> v(b.size() / sizeof(float));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(float));
  return v;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(double(a[i]) - double(b[i]));
    if (!(e <= m)) m = std::isnan(e) ? INFINITY : e;
  }
  return m;
}

// The number after `label` in a program's output.
double number_after(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  INFO("looking for '" << label << "' in:\n" << text);
  REQUIRE(at != std::string::npos);
  return std::strtod(text.c_str() + at + label.size(), nullptr);
}

}  // namespace

TEST_CASE("libg3attn.so exports only g3attn_ symbols, every function of the header") {
  const g3test::CmdResult r = sh("nm -D --defined-only " + q(G3ATTN_LIB_FILE));
  std::istringstream in(r.out);
  std::string line;
  std::set<std::string> names;
  std::vector<std::string> other;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const std::string name = line.substr(line.find_last_of(' ') + 1);
    (name.rfind("g3attn_", 0) == 0 ? names.insert(name), void() : other.push_back(line));
  }
  std::printf("nm -D --defined-only %s: %zu g3attn_ symbols, %zu others\n", G3ATTN_LIB_FILE, names.size(),
              other.size());
  for (const auto& o : other) std::printf("  not g3attn_: %s\n", o.c_str());
  CHECK(other.empty());
  for (const char* f : kApi) {
    INFO(f);
    CHECK(names.count(f) == 1);
  }
  CHECK(names.size() == sizeof kApi / sizeof kApi[0]);
  // The SONAME carries the ABI number.
  const g3test::CmdResult d = sh("objdump -p " + q(G3ATTN_LIB_FILE));
  CHECK(d.out.find("SONAME               libg3attn.so." + std::to_string(G3ATTN_ABI_VERSION_FOR_TEST)) !=
        std::string::npos);
}

TEST_CASE("install, build the examples with find_package and pkg-config, compare with the CLI") {
  g3test::TempDir tmp;
  const std::string P = tmp.file("prefix");
  sh("cmake --install " + q(G3ATTN_BINARY_DIR) + " --prefix " + q(P));

  // The GNU layout: lib/ (or lib/<multiarch>/ under /usr) holds the library,
  // the CMake package and the pkg-config file.
  std::string libdir;
  for (const auto& e : fs::recursive_directory_iterator(P))
    if (e.path().filename() == "libg3attn.so") libdir = e.path().parent_path().string();
  REQUIRE(!libdir.empty());
  for (const std::string f : {"/include/g3attn/g3attn.h", "/include/g3attn/version.h",
                              "/include/g3attn/kernel_contract.h", "/bin/g3attn",
                              "/share/doc/g3attn/examples/CMakeLists.txt"}) {
    INFO(P + f);
    CHECK(fs::exists(P + f));
  }
  CHECK(fs::exists(libdir + "/libg3attn.so." + std::to_string(G3ATTN_ABI_VERSION_FOR_TEST)));
  CHECK(fs::exists(libdir + "/pkgconfig/g3attn.pc"));
  CHECK(fs::exists(libdir + "/cmake/g3attn/g3attnConfig.cmake"));
  CHECK(fs::exists(libdir + "/cmake/g3attn/g3attnConfigVersion.cmake"));
  const std::string ex = P + "/share/doc/g3attn/examples";

  // Built with CMake against the prefix (the package's imported target).
  const std::string cm = tmp.file("cmake-build");
  sh("cmake -S " + q(ex) + " -B " + q(cm) + " -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=" + q(P) +
     " '-DCMAKE_C_FLAGS=" + kSanitize + "' '-DCMAKE_CXX_FLAGS=" + kSanitize + "' '-DCMAKE_EXE_LINKER_FLAGS=" +
     kSanitize + "'");
  sh("cmake --build " + q(cm) + " -j2");
  // The package checks versions: same major and minor accepted (the
  // examples ask for 0.1), anything else refused at configure time.
  const std::string vp = tmp.file("version-probe");
  fs::create_directories(vp);
  g3test::write_text(vp + "/CMakeLists.txt",
                     "cmake_minimum_required(VERSION 3.25)\nproject(probe NONE)\n"
                     "find_package(g3attn 99.0 CONFIG REQUIRED)\n");
  const g3test::CmdResult bad_version =
      g3test::run_shell("cmake -S " + q(vp) + " -B " + q(vp + "/b") + " -DCMAKE_PREFIX_PATH=" + q(P));
  CHECK(bad_version.exit_code != 0);
  CHECK(bad_version.err.find("99.0") != std::string::npos);
  // The programs load the installed library, not the build tree's.
  const g3test::CmdResult ldd = sh("ldd " + q(cm + "/prefill_decode"));
  CHECK(ldd.out.find(libdir + "/libg3attn.so." + std::to_string(G3ATTN_ABI_VERSION_FOR_TEST)) != std::string::npos);

  // Built with pkg-config: the C examples as strict C99 with warnings as
  // errors (the public header must be clean C), the C++ one as C++17.
  const std::string pc = tmp.file("pc-build");
  fs::create_directories(pc);
  const std::string env = "PKG_CONFIG_PATH=" + q(libdir + "/pkgconfig") + " ";
  const std::string flags = sh(env + "pkg-config --cflags --libs g3attn").out;
  CHECK(flags.find("-lg3attn") != std::string::npos);
  const std::string f = flags.substr(0, flags.find_last_not_of(" \n") + 1);
  for (const char* c : {"prefill_decode", "head_ranges"})
    sh("cc -std=c99 -pedantic -Wall -Wextra -Werror -O1" + kSanitize + " " + q(ex + "/" + c + ".c") + " " + f + " -lm -o " +
       q(pc + "/" + c));
  sh("c++ -std=c++17 -Wall -O1" + kSanitize + " " + q(ex + "/kernels_by_key.cpp") + " " + f + " -o " + q(pc + "/kernels_by_key"));
  const std::string run_env = "LD_LIBRARY_PATH=" + q(libdir) + " ";

  // The examples' input (x[t][d] = sin(0.7 (t + 1) + 1.3 (d + 1)) at
  // positions 0, 1, ...), as .npy files for the CLI.
  const int64_t T = 14, D = 64;
  std::vector<float> x(size_t(T * D));
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    pos[size_t(t)] = int32_t(t);
    for (int64_t d = 0; d < D; ++d) x[size_t(t * D + d)] = float(std::sin(0.7 * double(t + 1) + 1.3 * double(d + 1)));
  }
  g3::write_npy_f32(tmp.file("x.npy"), x.data(), {1, T, D});
  write_npy_i32(tmp.file("positions.npy"), pos, {1, T});

  for (const char* name : {"tiny_local_L0_T12_B2_rightpad", "tiny_global_L5_T12_B2_rightpad"}) {
    const std::string cfg = g3test::golden_file(name, "config.json");
    const std::string wts = g3test::golden_file(name, "weights.safetensors");
    const std::string layer = std::string(name).find("L5") != std::string::npos ? "5" : "0";
    // The installed CLI: all 14 tokens in one call, keys = the call's tokens.
    sh(q(P + "/bin/g3attn") + " apply --config " + q(cfg) + " --weights " + q(wts) + " --layer " + layer +
       " --input " + q(tmp.file("x.npy")) + " --positions " + q(tmp.file("positions.npy")) + " --out " +
       q(tmp.file("cli.npy")));
    const std::vector<float> cli = g3::read_npy_f32(tmp.file("cli.npy")).f32;
    REQUIRE(cli.size() == size_t(T * D));

    for (const std::string& dir : {cm, pc}) {
      const char* how = dir == cm ? "find_package" : "pkg-config";
      // Bound: the examples run the prompt in chunks through caches and
      // decode one token per call, the CLI one call without a cache; the
      // same kernels over another tiling of the keys agree to a few f32
      // roundings (test_api_block measures the same bound, 2e-5).
      const double bound = 2e-5;
      const std::string out1 = tmp.file("pd.bin"), out2 = tmp.file("kk.bin"), out3 = tmp.file("hr.bin");
      const auto pd = sh(run_env + q(dir + "/prefill_decode") + " " + q(cfg) + " " + q(wts) + " " + layer +
                         " 10 4 4 " + q(out1));
      const auto kk = sh(run_env + q(dir + "/kernels_by_key") + " " + q(cfg) + " " + q(wts) + " " + layer +
                         " 10 4 " + q(out2));
      const auto hr = sh(run_env + q(dir + "/head_ranges") + " " + q(cfg) + " " + q(wts) + " " + layer + " 12 " +
                         q(out3));
      const double d1 = max_diff(read_raw(out1), cli), d2 = max_diff(read_raw(out2), cli),
                   d3 = max_diff(read_raw(out3), cli);
      std::printf("--- %s, %s: prefill_decode\n%s--- kernels_by_key\n%s--- head_ranges\n%s", name, how, pd.out.c_str(),
                  kk.out.c_str(), hr.out.c_str());
      std::printf("vs g3attn apply: prefill_decode %.3g, kernels_by_key %.3g, head_ranges %.3g (bound %.3g)\n", d1,
                  d2, d3, bound);
      CHECK(d1 <= bound);
      CHECK(d2 <= bound);
      CHECK(d3 <= bound);
      CHECK(number_after(kk.out, "max |own loops - g3attn_block| =") <= bound);
      CHECK(number_after(hr.out, "max |whole - (range 0 + range 1)| =") <= 1e-5);
      CHECK(number_after(hr.out, "max |whole - split| =") <= 1e-4);
    }
  }
}
