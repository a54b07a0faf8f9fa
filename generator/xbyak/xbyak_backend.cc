// The Xbyak backend's entry points (generator/backend_api.h): what it can
// serve for a key on this CPU under an ISA cap, and the kernels themselves.
// Only the attention core is JIT'd; the other stages stay null so the
// registry takes them from Highway.
#include <string>
#include <xbyak/xbyak_util.h>

#include "generator/errors.h"
#include "generator/xbyak/xbyak_core.h"

namespace g3::xbyak {

namespace {

struct HostCpu {
  bool avx2 = false, avx512 = false, bf16 = false;
  HostCpu() {
    Xbyak::util::Cpu cpu;
    using C = Xbyak::util::Cpu;
    avx2 = cpu.has(C::tAVX2) && cpu.has(C::tFMA);
    avx512 = avx2 && cpu.has(C::tAVX512F) && cpu.has(C::tAVX512BW) && cpu.has(C::tAVX512DQ) &&
             cpu.has(C::tAVX512VL);
    bf16 = avx512 && cpu.has(C::tAVX512_BF16);
  }
};

const HostCpu& host() {
  static const HostCpu h;
  return h;
}

}  // namespace

CoreConfig CoreConfig::make(const KernelKey& key, Isa isa, bool bf16_dot) {
  CoreConfig c;
  c.head_dim = key.head_dim;
  c.group = key.group;
  c.window = key.window;
  c.bf16_kv = key.kv_dtype == DType::BF16;
  c.bf16_dot = bf16_dot;
  c.isa = isa;
  if (isa == Isa::Avx512) {
    // 32 zmm: QK holds 12 rows x 2 key vectors (24) + 2 keys + 1 broadcast;
    // PV holds 6 rows x 4 head_dim vectors (24) + 4 values + 1 broadcast.
    c.vl = 16;
    c.qk_rows = 12;
    c.pv_rows = 6;
  } else {
    // 16 ymm: QK 6 x 2 (12) + 2 + 1; PV 6 x 2 (12) + 2 + 1.
    c.vl = 8;
    c.qk_rows = 6;
    c.pv_rows = 6;
  }
  c.tk = 2 * c.vl;
  c.kb = 2 * c.tk;
  const int nvec = c.head_dim / c.vl;
  const int want = isa == Isa::Avx512 ? 4 : 2;
  c.pv_vecs = nvec % want == 0 ? want : nvec % 2 == 0 ? 2 : 1;
  // Query tile rows (tokens x G): larger tiles re-read each K/V block fewer
  // times (f32 prefill 4B global: 68 GFLOP/s at 32 rows, 86 at 96, thread
  // CPU time), smaller ones waste less at the edges of a local window.
  c.q_tile_rows = key.window > 0 ? 64 : 96;
  return c;
}

bool plan(const KernelKey& key, const std::string& cap, const Options& opt, CoreConfig* cfg, std::string* why) {
  auto fail = [&](const std::string& msg) {
    if (why) *why = msg;
    return false;
  };
  Isa isa;
  if (cap == "avx3" || cap == "avx3_dl") {
    if (host().avx512) isa = Isa::Avx512;
    else if (host().avx2) isa = Isa::Avx2;
    else return fail("this CPU has neither AVX-512 (F, BW, DQ, VL) nor AVX2+FMA");
  } else if (cap == "avx2") {
    if (!host().avx2) return fail("this CPU lacks AVX2+FMA");
    isa = Isa::Avx2;
  } else {
    return fail("ISA cap '" + cap + "' is below avx2; the Xbyak kernels need AVX2+FMA or AVX-512");
  }
  const int vl = isa == Isa::Avx512 ? 16 : 8;
  if (key.head_dim <= 0 || key.head_dim % vl != 0 || key.head_dim > 4096)
    return fail("head_dim " + std::to_string(key.head_dim) + " is not a multiple of " + std::to_string(vl) +
                " (the vector width in f32) up to 4096");
  if (key.group < 1 || key.group > 256) return fail("group " + std::to_string(key.group) + " outside 1..256");
  // The bf16 compute mode is exactly what vdpbf16ps does on bf16 K/V (q and
  // p rounded to bf16, exact products, f32 sums); on f32 K/V the kernels
  // would have to round K and V as they load them, which they do not.
  if (key.compute == DType::BF16) {
    if (key.kv_dtype != DType::BF16) return fail("bf16 compute needs bf16 K/V here (the f32 K/V path does not round them)");
    if (isa != Isa::Avx512 || !host().bf16) return fail("bf16 compute needs AVX512_BF16 (vdpbf16ps) under an avx3 cap");
  }
  const bool dot = key.kv_dtype == DType::BF16 && isa == Isa::Avx512 && host().bf16 &&
                   (opt.allow_bf16_dot || key.compute == DType::BF16);
  *cfg = CoreConfig::make(key, isa, dot);
  return true;
}

BackendKernels kernels(const KernelKey& key, const std::string& cap, const Options& opt) {
  CoreConfig cfg;
  std::string why;
  if (!plan(key, cap, opt, &cfg, &why)) throw InputError("xbyak backend: " + why);
  const std::string isa = cfg.isa == Isa::Avx512 ? "avx3" : "avx2";
  auto k = build_core(cfg, key.ident() + "_" + isa + (cfg.bf16_dot ? "_dpbf16" : ""));
  BackendKernels out;
  out.table.core = core_entry(*k);
  out.isa = isa;
  out.specialised = true;
  out.compile_ms = core_gen_ms(*k);
  out.note = std::string("xbyak attention core, ") + (cfg.isa == Isa::Avx512 ? "AVX-512" : "AVX2+FMA") +
             (cfg.bf16_dot ? ", bf16 K/V via vdpbf16ps (q and p rounded to bf16)"
                           : cfg.bf16_kv ? ", bf16 K/V widened to f32" : ", f32 K/V") +
             ", " + std::to_string(core_code_bytes(*k)) + " bytes of code";
  out.owner = k;
  return out;
}

}  // namespace g3::xbyak

namespace g3 {

bool xbyak_available(const KernelKey& key, const std::string& isa, std::string* why) {
  xbyak::CoreConfig cfg;
  return xbyak::plan(key, isa, xbyak::Options{}, &cfg, why);
}

BackendKernels xbyak_kernels(const KernelKey& key, const std::string& isa) {
  return xbyak::kernels(key, isa, xbyak::Options{});
}

}  // namespace g3
