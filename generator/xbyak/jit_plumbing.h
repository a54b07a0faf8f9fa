// What every Xbyak generator of this folder needs around its kernels: the
// trampoline that gives a context-free g3_core_fn its per-key context, and
// the G3ATTN_XBYAK_DUMP hook that writes emitted code to disk for objdump.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <xbyak/xbyak.h>

#include "templates/kernel_contract.h"

namespace g3::xbyak {

// The contract's g3_core_fn carries no context, so each kernel key gets a
// three-instruction trampoline that supplies it: core(args) becomes
// driver(ctx, args) with the key's context baked in as an immediate.
template <class Ctx>
struct ContextEntry : Xbyak::CodeGenerator {
  ContextEntry(const Ctx* ctx, void (*driver)(const Ctx*, const g3_core_args*)) : Xbyak::CodeGenerator(64) {
    using namespace Xbyak::util;
    mov(rsi, rdi);
    mov(rdi, reinterpret_cast<uint64_t>(ctx));
    mov(rax, reinterpret_cast<uint64_t>(driver));
    jmp(rax);
  }
};

// With G3ATTN_XBYAK_DUMP=DIR, writes a kernel's bytes to DIR/<name>_<kernel>.bin
// (objdump -D -b binary -m i386:x86-64 reads them); a warning if it cannot.
inline void dump_code(const std::string& name, const std::string& kernel, const Xbyak::CodeGenerator& g) {
  const char* dir = std::getenv("G3ATTN_XBYAK_DUMP");
  if (!dir || !*dir) return;
  const std::string path = std::string(dir) + "/" + name + "_" + kernel + ".bin";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(g.getCode(), 1, g.getSize(), f);
    std::fclose(f);
  } else {
    std::fprintf(stderr, "g3attn: warning: G3ATTN_XBYAK_DUMP: cannot write %s\n", path.c_str());
  }
}

}  // namespace g3::xbyak
