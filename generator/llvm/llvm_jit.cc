// The LLVM ORC side of the backend: one LLJIT per process (created on first
// use, thread safe), a target machine per compile (they are not thread
// safe, and creating one costs well under a millisecond), the pass pipeline
// (a short function pipeline by default, LLVM's O1-O3 under G3ATTN_LLVM_OPT:
// see opt_level), object emission, the on-disk object cache, and linking
// each object into its own JITDylib so the same function names can be reused
// for every key.
#include <llvm/Analysis/CGSCCPassManager.h>
#include <llvm/Analysis/LoopAnalysisManager.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Transforms/InstCombine/InstCombine.h>
#include <llvm/Transforms/Scalar/EarlyCSE.h>
#include <llvm/Transforms/Scalar/LICM.h>
#include <llvm/Transforms/Scalar/LoopPassManager.h>
#include <llvm/Transforms/Scalar/SROA.h>
#include <llvm/Transforms/Scalar/SimplifyCFG.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <stdexcept>

#include "generator/errors.h"
#include "generator/highway/flash_ops.h"
#include "generator/llvm/jit_cache.h"
#include "generator/llvm/llvm_backend.h"
#include "generator/llvm/llvm_ir.h"
#include "templates/mask_rule.h"

// Helpers the JIT'd code calls (registered as absolute symbols).
extern "C" {
// SPEC 2.2: theta_i = pos / timescale_i / scale in double, sin and cos in
// double, rounded to f32 once: the same arithmetic as ref::rope.
static void g3_llvm_rope_table(int64_t pos, const double* timescale, int64_t half, double scale, float* cos_out,
                               float* sin_out) {
  for (int64_t i = 0; i < half; ++i) {
    double theta = double(pos) / timescale[i] / scale;
    cos_out[i] = static_cast<float>(std::cos(theta));
    sin_out[i] = static_cast<float>(std::sin(theta));
  }
}
// The structured mask (mask_rule.h, the one copy of the rule) for the
// emitted core: the bounds of a query tile's rows (row tt * G + g is token
// t0 + tt, clamped to T - 1 past the end) and their extremes.
static void g3_llvm_tile_rows(const g3_core_args* a, int64_t t0, int64_t ntok, int64_t G, g3_row_bounds* rb,
                              g3_row_set* rs) {
  *rs = g3_row_set_empty();
  for (int64_t tt = 0; tt < ntok; ++tt) {
    const int64_t t = t0 + tt < a->T ? t0 + tt : a->T - 1;
    const g3_row_bounds b = g3_bounds_of(a, t);
    g3_row_set_add(rs, b);
    for (int64_t g = 0; g < G; ++g) rb[tt * G + g] = b;
  }
}
// A key tile's class against the rows (g3_classify) and, unless it is
// skipped, its stored positions and validity (-1 valid, 0 invalid or past S).
static int32_t g3_llvm_tile_class(const g3_core_args* a, int64_t s0, int64_t width, const g3_row_set* rs,
                                  int32_t* kp, int32_t* kv) {
  const g3_tile_info ti = g3_tile_info_of(a, s0, width);
  const int c = g3_classify(&ti, rs);
  if (c != G3_TILE_SKIP)
    for (int64_t j = 0; j < width; ++j) {
      const int64_t s = s0 + j;
      kp[j] = s < a->S ? a->kpos[s] : 0;
      kv[j] = s < a->S && a->kvalid[s] ? -1 : 0;
    }
  return c;
}
}

namespace g3 {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> g_compiles{0};
std::atomic<int> g_hits{0};

std::string to_string(llvm::Error e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << e;
  return os.str();
}

struct Jit {
  std::unique_ptr<llvm::orc::LLJIT> lljit;
  std::string host_cpu, host_features;
  std::string triple;
  std::atomic<int> next_dylib{0};
  std::string error;  // non-empty: the JIT could not be created
};

// The process-wide JIT. Deliberately leaked: kernel tables handed out by the
// registry live in static memos that may be destroyed after any static of
// ours, and their owners must still find the JIT alive.
Jit& jit() {
  static Jit* j = [] {
    auto* p = new Jit;
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
    if (!jtmb) {
      p->error = "cannot detect the host target: " + to_string(jtmb.takeError());
      return p;
    }
    p->host_cpu = jtmb->getCPU();
    p->host_features = jtmb->getFeatures().getString();
    p->triple = jtmb->getTargetTriple().str();
    auto lj = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(*jtmb)).create();
    if (!lj) {
      p->error = "cannot create the ORC LLJIT: " + to_string(lj.takeError());
      return p;
    }
    p->lljit = std::move(*lj);
    return p;
  }();
  return *j;
}

bool has_feature(const std::string& features, const std::string& f) {
  return ("," + features + ",").find(",+" + f + ",") != std::string::npos;
}

std::unique_ptr<llvm::TargetMachine> make_tm(const LlvmTarget& t) {
  Jit& j = jit();
  llvm::orc::JITTargetMachineBuilder jtmb{llvm::Triple(j.triple)};
  jtmb.setCPU(t.cpu);
  if (!t.features.empty()) {
    llvm::SubtargetFeatures f(t.features);
    jtmb.addFeatures(f.getFeatures());
  }
  jtmb.setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
  jtmb.setRelocationModel(llvm::Reloc::PIC_);
  jtmb.setCodeModel(llvm::CodeModel::Small);
  auto tm = jtmb.createTargetMachine();
  if (!tm) throw std::runtime_error("llvm backend: cannot create a target machine for " + t.cpu + ": " +
                                    to_string(tm.takeError()));
  return std::move(*tm);
}

// The IR pipeline: G3ATTN_LLVM_OPT=O1|O2|O3 selects LLVM's standard
// per-module pipeline; the default ("fast") is a focused function pipeline
// of the same PassBuilder passes. The emitted IR is already vectorised and
// blocked by hand, so what it needs is promotion of the allocas (SROA),
// redundancy removal and loop-invariant hoisting; O3 took about 10x longer
// (700 ms vs 80 ms per key on the loaded build machine) and gave no faster
// core (11.6 vs 12.4 GFLOP/s in the same run).
std::string opt_level() {
  const char* lv = std::getenv("G3ATTN_LLVM_OPT");
  std::string s = lv ? lv : "";
  return s == "O1" || s == "O2" || s == "O3" ? s : "fast";
}

void optimise(llvm::Module& m, llvm::TargetMachine* tm) {
  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  llvm::PassBuilder pb(tm);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  const std::string level = opt_level();
  llvm::ModulePassManager mpm;
  if (level == "O3") mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
  else if (level == "O2") mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2);
  else if (level == "O1") mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O1);
  else {
    llvm::FunctionPassManager fpm;
    fpm.addPass(llvm::SROAPass(llvm::SROAOptions::ModifyCFG));
    fpm.addPass(llvm::EarlyCSEPass(true));
    fpm.addPass(llvm::InstCombinePass());
    fpm.addPass(llvm::SimplifyCFGPass());
    fpm.addPass(llvm::createFunctionToLoopPassAdaptor(llvm::LICMPass(llvm::LICMOptions()), true));
    fpm.addPass(llvm::EarlyCSEPass(true));
    fpm.addPass(llvm::InstCombinePass());
    fpm.addPass(llvm::SimplifyCFGPass());
    mpm.addPass(llvm::createModuleToFunctionPassAdaptor(std::move(fpm)));
  }
  mpm.run(m, mam);
}

// IR for the key, optimised, then emitted as an object or as assembly.
llvm::SmallVector<char, 0> build_object(const KernelKey& key, const LlvmTarget& t, bool assembly) {
  const auto t0 = Clock::now();
  auto tm = make_tm(t);
  llvm::LLVMContext ctx;
  llvm::Module m("g3attn_" + key.ident(), ctx);
  m.setTargetTriple(tm->getTargetTriple().str());
  m.setDataLayout(tm->createDataLayout());
  llvmjit::IrTarget it{t.cpu, t.features, t.vector_bits};
  llvmjit::emit_kernels(m, key, it);
  std::string verr;
  llvm::raw_string_ostream vos(verr);
  if (llvm::verifyModule(m, &vos)) throw std::logic_error("llvm backend emitted invalid IR: " + vos.str());
  const auto t1 = Clock::now();
  optimise(m, tm.get());
  const auto t2 = Clock::now();
  llvm::SmallVector<char, 0> out;
  llvm::raw_svector_ostream os(out);
  llvm::legacy::PassManager pm;
  if (tm->addPassesToEmitFile(pm, os, nullptr,
                              assembly ? llvm::CodeGenFileType::AssemblyFile : llvm::CodeGenFileType::ObjectFile))
    throw std::logic_error("llvm backend: the target cannot emit object files");
  pm.run(m);
  if (std::getenv("G3ATTN_LLVM_VERBOSE")) {
    auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    size_t insts = 0;
    for (auto& f : m) insts += f.getInstructionCount();
    std::fprintf(stderr, "g3attn: llvm %s on %s: IR %.1f ms, opt %.1f ms, codegen %.1f ms, %zu IR instructions\n",
                 key.str().c_str(), t.cpu.c_str(), ms(t0, t1), ms(t1, t2), ms(t2, Clock::now()), insts);
  }
  return out;
}

// Everything the object's bytes depend on; the cache entry's identity.
std::string identity(const KernelKey& key, const std::string& isa, const LlvmTarget& t) {
  return "g3attn llvm object\ngenerator " + std::to_string(llvmjit::kGeneratorVersion) + "\nllvm " +
         LLVM_VERSION_STRING + "\nopt " + opt_level() + "\nisa " + isa + "\ncpu " + t.cpu + "\nfeatures " + t.features + "\nkey " + key.str() +
         "\n";
}

// Links an object into a fresh JITDylib; returns the two entry points and
// an owner that removes the dylib when the last table user lets go.
struct Linked {
  g3_qk_fn qk = nullptr;
  g3_core_fn core = nullptr;
  std::shared_ptr<void> owner;
};

Linked link_object(const llvm::SmallVector<char, 0>& obj, const FlashOps& flash, std::string* err) {
  Jit& j = jit();
  auto& es = j.lljit->getExecutionSession();
  auto jd = j.lljit->createJITDylib("g3k" + std::to_string(j.next_dylib++));
  if (!jd) {
    *err = to_string(jd.takeError());
    return {};
  }
  llvm::orc::JITDylib* d = &*jd;
  llvm::orc::SymbolMap helpers;
  auto flags = llvm::JITSymbolFlags::Exported | llvm::JITSymbolFlags::Callable;
  helpers[j.lljit->mangleAndIntern(llvmjit::kRopeHelper)] = {
      llvm::orc::ExecutorAddr::fromPtr(&g3_llvm_rope_table), flags};
  helpers[j.lljit->mangleAndIntern(llvmjit::kTileRowsHelper)] = {
      llvm::orc::ExecutorAddr::fromPtr(&g3_llvm_tile_rows), flags};
  helpers[j.lljit->mangleAndIntern(llvmjit::kTileClassHelper)] = {
      llvm::orc::ExecutorAddr::fromPtr(&g3_llvm_tile_class), flags};
  helpers[j.lljit->mangleAndIntern(llvmjit::kInitRowsHelper)] = {llvm::orc::ExecutorAddr::fromPtr(flash.init_rows),
                                                                   flags};
  helpers[j.lljit->mangleAndIntern(llvmjit::kSoftmaxHelper)] = {
      llvm::orc::ExecutorAddr::fromPtr(flash.softmax_tile), flags};
  helpers[j.lljit->mangleAndIntern(llvmjit::kFinishRowHelper)] = {
      llvm::orc::ExecutorAddr::fromPtr(flash.finish_row), flags};
  auto remove = [&es, d] {
    if (auto e = es.removeJITDylib(*d)) llvm::consumeError(std::move(e));
  };
  if (auto e = d->define(llvm::orc::absoluteSymbols(std::move(helpers)))) {
    *err = to_string(std::move(e));
    remove();
    return {};
  }
  auto buf = llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(obj.data(), obj.size()), "g3attn-kernel");
  if (auto e = j.lljit->addObjectFile(*d, std::move(buf))) {
    *err = to_string(std::move(e));
    remove();
    return {};
  }
  auto qk = j.lljit->lookup(*d, llvmjit::kQkName);
  if (!qk) {
    *err = to_string(qk.takeError());
    remove();
    return {};
  }
  auto core = j.lljit->lookup(*d, llvmjit::kCoreName);
  if (!core) {
    *err = to_string(core.takeError());
    remove();
    return {};
  }
  Linked l;
  l.qk = qk->toPtr<g3_qk_fn>();
  l.core = core->toPtr<g3_core_fn>();
  l.owner = std::shared_ptr<void>(d, [remove](void*) { remove(); });
  return l;
}

void warn(const std::string& s) { std::fprintf(stderr, "g3attn: warning: %s\n", s.c_str()); }

}  // namespace

int llvm_compiles() { return g_compiles.load(); }
int llvm_cache_hits() { return g_hits.load(); }

bool llvm_available(std::string* why) {
  Jit& j = jit();
  if (!j.error.empty()) {
    if (why) *why = j.error;
    return false;
  }
  return true;
}

LlvmTarget llvm_target_for(const std::string& isa) {
  Jit& j = jit();
  LlvmTarget t;
  auto host = [&] {
    t.cpu = j.host_cpu;
    t.features = j.host_features;
    t.vector_bits = has_feature(t.features, "avx512f") ? 512 : has_feature(t.features, "avx2") ? 256 : 128;
  };
  if (isa == "best" || isa == "host") {
    host();
  } else if (isa == "avx3_dl") {
    if (has_feature(j.host_features, "avx512vnni") && has_feature(j.host_features, "avx512vbmi2")) host();
    else t = {"icelake-server", "", 512};
  } else if (isa == "avx3") {
    t = {"x86-64-v4", "", 512};
  } else if (isa == "avx2") {
    t = {"x86-64-v3", "", 256};
  } else if (isa == "sse4") {
    t = {"x86-64-v2", "", 128};
  } else if (isa == "ssse3") {
    t = {"core2", "", 128};
  } else if (isa == "scalar") {
    t = {"x86-64", "", 128};
  } else {
    throw InputError("llvm backend: unknown ISA '" + isa + "'");
  }
  return t;
}

BackendKernels llvm_kernels_with(const KernelKey& key, const std::string& isa, JitCache* cache) {
  const auto start = Clock::now();
  std::string why;
  if (!llvm_available(&why)) throw InputError("llvm backend unavailable: " + why);
  if (key.head_dim <= 0 || key.head_dim % 2 != 0 || key.group <= 0)
    throw InputError("llvm backend: kernel key " + key.str() + " has no valid head_dim/group");
  const LlvmTarget t = llvm_target_for(isa);
  const std::string id = identity(key, isa, t);

  Linked l;
  bool hit = false;
  if (cache && cache->can_read()) {
    if (auto bytes = cache->load(id)) {
      llvm::SmallVector<char, 0> obj(bytes->begin(), bytes->end());
      std::string err;
      l = link_object(obj, flash_ops(isa), &err);
      if (l.qk) hit = true;
      else warn("kernel cache entry " + cache->entry_path(id) + " does not link (" + err + "); recompiling");
    }
  }
  if (!hit) {
    llvm::SmallVector<char, 0> obj = build_object(key, t, false);
    ++g_compiles;
    if (cache) cache->store(id, obj.data(), obj.size());
    std::string err;
    l = link_object(obj, flash_ops(isa), &err);
    if (!l.qk) throw std::runtime_error("llvm backend: cannot link the kernel for " + key.str() + ": " + err);
  } else {
    ++g_hits;
  }
  BackendKernels k;
  k.table.qk = l.qk;
  k.table.core = l.core;
  k.isa = isa;
  k.specialised = true;
  k.cached = hit;
  k.owner = l.owner;
  k.note = "llvm " LLVM_VERSION_STRING " for " + t.cpu;
  k.compile_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return k;
}

BackendKernels llvm_kernels(const KernelKey& key, const std::string& isa) {
  // No memo here: the runtime's kernel registry is the one memo of built
  // kernels; a call compiles, or loads from the process's disk cache.
  return llvm_kernels_with(key, isa, &JitCache::process_default());
}

std::string llvm_kernel_asm(const KernelKey& key, const std::string& isa) {
  std::string why;
  if (!llvm_available(&why)) throw InputError("llvm backend unavailable: " + why);
  auto s = build_object(key, llvm_target_for(isa), true);
  return std::string(s.data(), s.size());
}

}  // namespace g3
