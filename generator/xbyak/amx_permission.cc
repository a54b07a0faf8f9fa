#include "generator/xbyak/amx_permission.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <xbyak/xbyak_util.h>

namespace g3::amx {

namespace {

// From the kernel's uapi (asm/prctl.h and the xstate numbering); written out
// because older libc headers do not carry them.
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

int request_tile_data() {
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return 0;
  return errno != 0 ? errno : EPERM;
}

// The process-wide answer to the request, made once: a function-local
// static is initialised exactly once even when threads race to it, and the
// grant (or refusal) holds for every thread of the process.
int granted_once() {
  static const int err = request_tile_data();
  return err;
}

}  // namespace

std::string decide(const Probe& p) {
  if (p.env && (!std::strcmp(p.env, "off") || !std::strcmp(p.env, "0")))
    return std::string("AMX disabled by G3ATTN_AMX=") + p.env;
  if (!p.amx_tile || !p.amx_bf16) return "this CPU has no AMX-BF16 tiles (CPUID amx_tile and amx_bf16)";
  if (!p.avx512_bf16) return "this CPU has AMX tiles but not AVX512_BF16, which the AMX core converts with";
  const int err = p.request ? p.request() : EPERM;
  if (err != 0)
    return std::string("Linux refused this process the AMX tile data: arch_prctl ARCH_REQ_XCOMP_PERM for "
                       "XFEATURE_XTILEDATA failed with ") +
           std::strerror(err);
  return "";
}

std::string unavailable_reason() {
  // The CPUID part once; the environment on every call.
  static const Probe cpu = [] {
    Xbyak::util::Cpu c;
    using C = Xbyak::util::Cpu;
    Probe p;
    p.amx_tile = c.has(C::tAMX_TILE);
    p.amx_bf16 = c.has(C::tAMX_BF16);
    p.avx512_bf16 = c.has(C::tAVX512_BF16) && c.has(C::tAVX512F) && c.has(C::tAVX512BW) && c.has(C::tAVX512VL);
    return p;
  }();
  Probe p = cpu;
  p.env = std::getenv("G3ATTN_AMX");
  p.request = &granted_once;
  return decide(p);
}

}  // namespace g3::amx
