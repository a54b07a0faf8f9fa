// IR emission for the LLVM backend. The code is written as explicit vector
// IR (<VL x float>, llvm.fmuladd) with the head dimension, group size,
// window, RoPE table, alpha and KV dtype as constants, and runtime loops only
// where the trip count is a call argument (tokens, slots, heads). Loop-carried
// values live in allocas; the pass pipeline run before codegen (llvm_jit.cc:
// by default SROA, EarlyCSE, InstCombine, SimplifyCFG and LICM, or LLVM's
// O1-O3 under G3ATTN_LLVM_OPT) promotes them to registers. The default
// pipeline does not unroll, so loops with a constant trip count stay loops;
// the register blocking (rows x keys, rows x vectors of head_dim) is written
// out here, in the IR itself.
//
// The attention core is a flash-attention loop per tile of query rows
// (rows = tokens x the G query heads that share the KV head):
//   for each key tile of TK slots
//     skip it when the structured mask hides every slot from every row
//     S = Q K^T            (SPEC 1.3 step E; register-blocked dot products)
//     online softmax       (steps G-H with the structured mask, K_MASK rows
//                           never reach here: invisible keys get p = 0)
//     O = O * rescale + P V  (step I)
// and a final O / l, lse = m + log l per row (zeros and -inf for a row with no
// visible key, as the contract says).
#include "generator/llvm/llvm_ir.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <vector>

#include "templates/decode_prefetch.h"
#include "templates/kernel_contract.h"
#include "templates/mask_rule.h"

namespace g3::llvmjit {

using namespace llvm;

namespace {

int pow2_divisor(int n, int cap) {
  int v = 1;
  while (v * 2 <= cap && n % (v * 2) == 0) v *= 2;
  return v;
}

}  // namespace

CoreTiling core_tiling(const KernelKey& key, const IrTarget& t) {
  CoreTiling c;
  c.vl = pow2_divisor(key.head_dim, t.vector_bits / 32);
  // About 64 query rows per tile: each K/V tile is then read once per 64
  // rows; the rows' accumulators (64 x head_dim floats, 64 KB at head_dim
  // 256) stay in L2. Measured on the 4B global shape (Zen 4): 16 rows 0.81x
  // the Highway core, 32 rows 0.89x, 64 rows 0.97x (side by side, noisy).
  c.tq = std::max(1, 64 / std::max(1, key.group));
  // Key tiles of 16 slots: one zmm of P per row, and the unit of skipping.
  c.tk = 16;
  // Register blocks whose accumulators fill half the vector registers, so
  // the operands beside them (and a target without FMA, its product
  // temporaries) fit in the rest without spills: 4 x 4 with AVX-512's 32
  // registers; 2 rows x 4 keys and 4 rows x 2 vectors with the 16 of SSE
  // and AVX2, where 4 x 4 spilled.
  const bool regs32 = t.vector_bits >= 512;
  c.qk_rows = regs32 ? 4 : 2;
  c.qk_keys = 4;
  c.pv_rows = 4;
  c.pv_vecs = regs32 ? 4 : 2;
  return c;
}

namespace {

class Emitter {
 public:
  Emitter(Module& m, const KernelKey& key, const IrTarget& t)
      : C(m.getContext()), M(m), b(m.getContext()), key_(key), tgt_(t) {
    f32 = Type::getFloatTy(C);
    f64 = Type::getDoubleTy(C);
    i1 = Type::getInt1Ty(C);
    i8 = Type::getInt8Ty(C);
    i16 = Type::getInt16Ty(C);
    i32 = Type::getInt32Ty(C);
    i64 = Type::getInt64Ty(C);
    ptr = PointerType::get(C, 0);
    tiling_ = core_tiling(key, t);
    H = key.head_dim;
    VL = tiling_.vl;
    NV = H / VL;
    bf16_ = key.kv_dtype == DType::BF16;
  }

  void emit_qk();
  void emit_core();

 private:
  struct CoreState;
  void emit_qk_tile(const CoreState& st, int R);
  void emit_pv_tile(const CoreState& st, int R);
  void emit_qk_decode(const CoreState& st, int R, int locality, bool ask_v);
  void emit_pv_decode(const CoreState& st, int R, int locality);
  void prefetch_lines(Value* base, Value* elem, int lines, int locality);

  // ---- small helpers -------------------------------------------------------
  Function* new_function(const char* name) {
    FunctionType* ft = FunctionType::get(Type::getVoidTy(C), {ptr}, false);
    Function* f = Function::Create(ft, Function::ExternalLinkage, name, M);
    f->addFnAttr("target-cpu", tgt_.cpu);
    if (!tgt_.features.empty()) f->addFnAttr("target-features", tgt_.features);
    // Without these the X86 backend may split 512-bit vectors on CPUs whose
    // tuning prefers 256-bit ones; our vectors are sized on purpose.
    f->addFnAttr("prefer-vector-width", std::to_string(tgt_.vector_bits));
    f->addFnAttr("min-legal-vector-width", std::to_string(tgt_.vector_bits));
    f->addFnAttr(Attribute::NoUnwind);
    f->getArg(0)->addAttr(Attribute::NoAlias);
    fn_ = f;
    BasicBlock* entry = BasicBlock::Create(C, "entry", f);
    b.SetInsertPoint(entry);
    return f;
  }

  // Allocas go to the entry block so mem2reg/SROA can promote them.
  Value* alloca_(Type* t, int64_t n, int align = 64) {
    IRBuilder<> e(&fn_->getEntryBlock(), fn_->getEntryBlock().begin());
    AllocaInst* a = e.CreateAlloca(t, ConstantInt::get(i64, n));
    a->setAlignment(Align(align));
    return a;
  }

  Value* field(Value* args, size_t off, Type* t) {
    return b.CreateLoad(t, b.CreateConstInBoundsGEP1_64(i8, args, off));
  }
  Value* c64(int64_t v) { return ConstantInt::get(i64, v); }
  Value* c32(int32_t v) { return ConstantInt::get(i32, v); }
  Value* cf(float v) { return ConstantFP::get(f32, v); }
  Type* vt(int n) { return FixedVectorType::get(f32, n); }
  Value* splat(int n, Value* s) { return b.CreateVectorSplat(n, s); }
  Value* splatf(int n, float v) { return ConstantFP::get(vt(n), v); }
  Value* gepf(Value* base, Value* idx) { return b.CreateInBoundsGEP(f32, base, idx); }
  Value* fmuladd(Value* a, Value* x, Value* c) {
    // llvm.fmuladd fuses where the target has FMA and stays a mul + add
    // elsewhere (llvm.fma would become a libm call on SSE targets).
    return b.CreateIntrinsic(Intrinsic::fmuladd, {a->getType()}, {a, x, c});
  }
  Value* loadv(Value* p, int n) { return b.CreateAlignedLoad(vt(n), p, Align(4)); }
  void storev(Value* v, Value* p) { b.CreateAlignedStore(v, p, Align(4)); }

  // n consecutive KV elements starting at element index `idx` (f32 or bf16,
  // widened to f32: bf16 is the upper half of an f32).
  Value* load_kv(Value* base, Value* idx, int n) {
    if (!bf16_) return loadv(gepf(base, idx), n);
    Value* p = b.CreateInBoundsGEP(i16, base, idx);
    Value* h = b.CreateAlignedLoad(FixedVectorType::get(i16, n), p, Align(2));
    Value* w = b.CreateShl(b.CreateZExt(h, FixedVectorType::get(i32, n)), 16);
    return b.CreateBitCast(w, vt(n));
  }
  // Stores n floats as KV elements, rounding to bf16 to nearest even (NaN
  // stays a quiet NaN), bit for bit as runtime/bf16.h does.
  void store_kv(Value* v, Value* base, Value* idx, int n) {
    if (!bf16_) {
      storev(v, gepf(base, idx));
      return;
    }
    Type* vi = FixedVectorType::get(i32, n);
    Value* u = b.CreateBitCast(v, vi);
    Value* isnan = b.CreateICmpUGT(b.CreateAnd(u, ConstantInt::get(vi, 0x7fffffff)), ConstantInt::get(vi, 0x7f800000));
    Value* nanv = b.CreateOr(b.CreateLShr(u, 16), ConstantInt::get(vi, 0x40));
    Value* lsb = b.CreateAnd(b.CreateLShr(u, 16), ConstantInt::get(vi, 1));
    Value* rnd = b.CreateLShr(b.CreateAdd(b.CreateAdd(u, ConstantInt::get(vi, 0x7fff)), lsb), 16);
    Value* r = b.CreateTrunc(b.CreateSelect(isnan, nanv, rnd), FixedVectorType::get(i16, n));
    b.CreateAlignedStore(r, b.CreateInBoundsGEP(i16, base, idx), Align(2));
  }

  // for (i = begin; i < end; i += step) body(i), signed i64.
  void for_(Value* begin, Value* end, int64_t step, const std::function<void(Value*)>& body) {
    BasicBlock* pre = b.GetInsertBlock();
    BasicBlock* hdr = BasicBlock::Create(C, "loop", fn_);
    BasicBlock* bod = BasicBlock::Create(C, "body", fn_);
    BasicBlock* ex = BasicBlock::Create(C, "exit", fn_);
    b.CreateBr(hdr);
    b.SetInsertPoint(hdr);
    PHINode* i = b.CreatePHI(i64, 2);
    i->addIncoming(begin, pre);
    b.CreateCondBr(b.CreateICmpSLT(i, end), bod, ex);
    b.SetInsertPoint(bod);
    body(i);
    Value* next = b.CreateAdd(i, c64(step));
    i->addIncoming(next, b.GetInsertBlock());
    b.CreateBr(hdr);
    b.SetInsertPoint(ex);
  }
  void if_(Value* cond, const std::function<void()>& then) {
    BasicBlock* th = BasicBlock::Create(C, "then", fn_);
    BasicBlock* ex = BasicBlock::Create(C, "endif", fn_);
    b.CreateCondBr(cond, th, ex);
    b.SetInsertPoint(th);
    then();
    b.CreateBr(ex);
    b.SetInsertPoint(ex);
  }

  // Horizontal reductions by halving (log2 n shuffles).
  Value* hreduce(Value* v, bool is_max) {
    int n = static_cast<int>(cast<FixedVectorType>(v->getType())->getNumElements());
    while (n > 1) {
      std::vector<int> lo, hi;
      for (int i = 0; i < n / 2; ++i) {
        lo.push_back(i);
        hi.push_back(i + n / 2);
      }
      Value* a = b.CreateShuffleVector(v, lo), *c = b.CreateShuffleVector(v, hi);
      v = is_max ? b.CreateSelect(b.CreateFCmpOGT(a, c), a, c) : b.CreateFAdd(a, c);
      n /= 2;
    }
    return b.CreateExtractElement(v, uint64_t(0));
  }

  // Reduces each accumulator vector to its lane sum, returning vectors whose
  // lanes are the sums in accumulator order. Pairs of vectors are combined
  // by interleaving half-groups (a transpose-and-add tree), so n
  // accumulators of VL lanes cost about n adds instead of n log VL.
  std::vector<Value*> transpose_reduce(std::vector<Value*> vs) {
    int width = VL, gs = VL;
    while (gs > 1) {
      std::vector<Value*> next;
      if (vs.size() >= 2) {
        std::vector<int> ix, iy;
        for (int src = 0; src < 2; ++src)
          for (int g = 0; g < width / gs; ++g)
            for (int l = 0; l < gs / 2; ++l) {
              ix.push_back(src * width + g * gs + l);
              iy.push_back(src * width + g * gs + gs / 2 + l);
            }
        for (size_t p = 0; p + 1 < vs.size(); p += 2) {
          Value* x = b.CreateShuffleVector(vs[p], vs[p + 1], ix);
          Value* y = b.CreateShuffleVector(vs[p], vs[p + 1], iy);
          next.push_back(b.CreateFAdd(x, y));
        }
      } else {
        std::vector<int> ix, iy;
        for (int g = 0; g < width / gs; ++g)
          for (int l = 0; l < gs / 2; ++l) {
            ix.push_back(g * gs + l);
            iy.push_back(g * gs + gs / 2 + l);
          }
        next.push_back(b.CreateFAdd(b.CreateShuffleVector(vs[0], ix), b.CreateShuffleVector(vs[0], iy)));
        width /= 2;
      }
      vs = next;
      gs /= 2;
    }
    return vs;
  }

  // RMSNorm (SPEC 2.1) of one head vector, then half-split RoPE (SPEC 2.2)
  // with the token's cos/sin table, times `scale` (alpha for q, 1 for k);
  // stores as f32 (q) or as a KV element (k).
  void norm_rope_head(Value* x, Value* w, Value* eps, Value* cosb, Value* sinb, float scale, Value* dst,
                      Value* dst_idx, bool dst_is_kv);

  LLVMContext& C;
  Module& M;
  IRBuilder<> b;
  const KernelKey& key_;
  IrTarget tgt_;
  CoreTiling tiling_;
  Function* fn_ = nullptr;
  Type *f32, *f64, *i1, *i8, *i16, *i32, *i64;
  PointerType* ptr;
  int H, VL, NV;
  bool bf16_;
};

void Emitter::norm_rope_head(Value* x, Value* w, Value* eps, Value* cosb, Value* sinb, float scale, Value* dst,
                             Value* dst_idx, bool dst_is_kv) {
  // Sum of squares in one vector accumulator, a vector of the head at a time.
  Value* acc = alloca_(vt(VL), 1);
  b.CreateStore(splatf(VL, 0.f), acc);
  for_(c64(0), c64(NV), 1, [&](Value* c) {
    Value* xv = loadv(gepf(x, b.CreateMul(c, c64(VL))), VL);
    b.CreateStore(fmuladd(xv, xv, b.CreateLoad(vt(VL), acc)), acc);
  });
  Value* ss = hreduce(b.CreateLoad(vt(VL), acc), false);
  Value* mean = b.CreateFAdd(b.CreateFMul(ss, cf(1.0f / float(H))), eps);
  Value* sq = b.CreateIntrinsic(Intrinsic::sqrt, {f32}, {mean});
  Value* r = b.CreateFDiv(cf(1.0f), sq);
  // Rotation pairs i and i + H/2 (half-split, not interleaved).
  const int half = H / 2;
  const int HL = pow2_divisor(half, VL);
  Value* rv = splat(HL, r);
  Value* one = splatf(HL, 1.0f);
  for_(c64(0), c64(half / HL), 1, [&](Value* c) {
    Value* i = b.CreateMul(c, c64(HL));
    Value* i2 = b.CreateAdd(i, c64(half));
    Value* y1 = b.CreateFMul(b.CreateFMul(loadv(gepf(x, i), HL), rv), b.CreateFAdd(one, loadv(gepf(w, i), HL)));
    Value* y2 = b.CreateFMul(b.CreateFMul(loadv(gepf(x, i2), HL), rv), b.CreateFAdd(one, loadv(gepf(w, i2), HL)));
    Value* cs = loadv(gepf(cosb, i), HL), *sn = loadv(gepf(sinb, i), HL);
    Value* o1 = b.CreateFSub(b.CreateFMul(y1, cs), b.CreateFMul(y2, sn));
    Value* o2 = b.CreateFAdd(b.CreateFMul(y2, cs), b.CreateFMul(y1, sn));
    if (scale != 1.0f) {
      o1 = b.CreateFMul(o1, splatf(HL, scale));
      o2 = b.CreateFMul(o2, splatf(HL, scale));
    }
    if (dst_is_kv) {
      store_kv(o1, dst, b.CreateAdd(dst_idx, i), HL);
      store_kv(o2, dst, b.CreateAdd(dst_idx, i2), HL);
    } else {
      storev(o1, gepf(dst, b.CreateAdd(dst_idx, i)));
      storev(o2, gepf(dst, b.CreateAdd(dst_idx, i2)));
    }
  });
}

// g3_qk_fn: SPEC 1.3 steps B-D for T tokens.
void Emitter::emit_qk() {
  new_function(kQkName);
  Value* a = fn_->getArg(0);
  using A = g3_qk_args;
  Value* T = field(a, offsetof(A, T), i64);
  Value* N = b.CreateSExt(field(a, offsetof(A, num_heads), i32), i64);
  Value* NK = b.CreateSExt(field(a, offsetof(A, num_kv_heads), i32), i64);
  Value* q = field(a, offsetof(A, q), ptr);
  Value* qs = field(a, offsetof(A, q_stride), i64);
  Value* k = field(a, offsetof(A, k), ptr);
  Value* v = field(a, offsetof(A, v), ptr);
  Value* kvs = field(a, offsetof(A, kv_stride), i64);
  Value* pos = field(a, offsetof(A, pos), ptr);
  Value* qn = field(a, offsetof(A, q_norm), ptr);
  Value* kn = field(a, offsetof(A, k_norm), ptr);
  Value* qo = field(a, offsetof(A, q_out), ptr);
  Value* qos = field(a, offsetof(A, q_out_stride), i64);
  Value* kc = field(a, offsetof(A, k_cache), ptr);
  Value* vc = field(a, offsetof(A, v_cache), ptr);
  Value* chs = field(a, offsetof(A, cache_head_stride), i64);
  Value* slot = field(a, offsetof(A, slot), ptr);
  Value* eps = field(a, offsetof(A, eps), f32);

  // The RoPE timescales base^(2i/dh) are constants of the key, computed here
  // in double exactly as ref::rope does; the helper turns them into the
  // token's cos/sin (SPEC 2.2, theta = pos / timescale / scale).
  const int half = H / 2;
  std::vector<double> ts(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) ts[i] = std::pow(key_.rope_base, 2.0 * double(i) / double(H));
  Constant* tsinit = ConstantDataArray::get(C, ArrayRef<double>(ts));
  auto* tsg = new GlobalVariable(M, tsinit->getType(), true, GlobalValue::InternalLinkage, tsinit, "g3_rope_ts");
  FunctionType* rope_ty = FunctionType::get(Type::getVoidTy(C), {i64, ptr, i64, f64, ptr, ptr}, false);
  FunctionCallee rope_fn = M.getOrInsertFunction(kRopeHelper, rope_ty);

  Value* cosb = alloca_(f32, half);
  Value* sinb = alloca_(f32, half);
  for_(c64(0), T, 1, [&](Value* t) {
    Value* p = b.CreateSExt(b.CreateLoad(i32, b.CreateInBoundsGEP(i32, pos, t)), i64);
    b.CreateCall(rope_fn, {p, tsg, c64(half), ConstantFP::get(f64, key_.rope_scale), cosb, sinb});
    for_(c64(0), N, 1, [&](Value* n) {
      Value* src = gepf(q, b.CreateAdd(b.CreateMul(t, qs), b.CreateMul(n, c64(H))));
      Value* di = b.CreateAdd(b.CreateMul(t, qos), b.CreateMul(n, c64(H)));
      // Step C: RoPE first, then q *= alpha (keys are never scaled).
      norm_rope_head(src, qn, eps, cosb, sinb, key_.alpha, qo, di, false);
    });
    Value* sl = b.CreateLoad(i64, b.CreateInBoundsGEP(i64, slot, t));
    if_(b.CreateICmpSGE(sl, c64(0)), [&] {
      for_(c64(0), NK, 1, [&](Value* j) {
        Value* off = b.CreateAdd(b.CreateMul(t, kvs), b.CreateMul(j, c64(H)));
        Value* di = b.CreateMul(b.CreateAdd(b.CreateMul(j, chs), sl), c64(H));
        norm_rope_head(gepf(k, off), kn, eps, cosb, sinb, 1.0f, kc, di, true);
        // Step D: V is stored raw (never normalised).
        Value* vs = gepf(v, off);
        for_(c64(0), c64(NV), 1, [&](Value* c) {
          Value* e = b.CreateMul(c, c64(VL));
          store_kv(loadv(gepf(vs, e), VL), vc, b.CreateAdd(di, e), VL);
        });
      });
    });
  });
  b.CreateRetVoid();
}

// g3_core_fn: SPEC 1.3 steps E-I for one KV head and its G query heads.
//
// The emitted code owns the arithmetic that the key specialises (Q.K^T and
// P.V with head_dim, G and the KV dtype folded in); the rule of which keys a
// row sees and the online softmax are the shared ones, called as helpers
// compiled for the same ISA: the bounds and tile classification of
// mask_rule.h, and the softmax step and row finish of templates/softmax-inl.h.
// Per query tile of TQ tokens (R = TQ x G rows):
//   rows:    bounds of every row and their extremes      (kTileRowsHelper)
//   init:    m, l of every row; O = 0                    (kInitRowsHelper)
//   per key tile of TK slots:
//     class: skip / partial / full, slot metadata        (kTileClassHelper)
//     S = Q K^T                                          (emit_qk_tile)
//     masked online softmax                              (kSoftmaxHelper)
//     O = O * corr + P V                                 (emit_pv_tile)
//   finish:  out = O / l, lse                            (kFinishRowHelper)
struct Emitter::CoreState {
  Value *a, *T, *q, *qs, *K, *V, *S, *kpos, *kvalid, *out, *os, *lse;
  Value *pf_ahead, *pf_l2;  // the decode prefetch: elements ahead, and into L2 (i1) rather than L1
  Value *Oacc, *Pbuf, *Mrow, *Lrow, *Corr, *qrow, *rbounds, *rowset, *kp_t, *kv_t, *kslot;
  std::vector<Value*> accs;  // vector accumulators (promoted to registers by mem2reg)
};

// S[r][j] = sum_h q_r[h] k_{s0+j}[h] for the tile's R rows: RB rows x SB
// keys per register block, VL-wide partial sums reduced at the end (tiles
// of many query rows; a decode tile takes emit_qk_decode).
void Emitter::emit_qk_tile(const CoreState& st, int R) {
  const int TK = tiling_.tk, SB = std::min(tiling_.qk_keys, TK), RB = pow2_divisor(R, tiling_.qk_rows);
  for_(c64(0), c64(R), RB, [&](Value* rb) {
    std::vector<Value*> qr;
    for (int i = 0; i < RB; ++i)
      qr.push_back(b.CreateLoad(ptr, b.CreateInBoundsGEP(ptr, st.qrow, b.CreateAdd(rb, c64(i)))));
    for_(c64(0), c64(TK), SB, [&](Value* sb) {
      std::vector<Value*> kb;
      for (int j = 0; j < SB; ++j)
        kb.push_back(
            b.CreateMul(b.CreateLoad(i64, b.CreateInBoundsGEP(i64, st.kslot, b.CreateAdd(sb, c64(j)))), c64(H)));
      const int NA = RB * SB;
      for (int x = 0; x < NA; ++x) b.CreateStore(splatf(VL, 0.f), st.accs[x]);
      for_(c64(0), c64(NV), 1, [&](Value* c) {
        Value* e = b.CreateMul(c, c64(VL));
        std::vector<Value*> qv, kv;
        for (int i = 0; i < RB; ++i) qv.push_back(loadv(gepf(qr[i], e), VL));
        for (int j = 0; j < SB; ++j) kv.push_back(load_kv(st.K, b.CreateAdd(kb[j], e), VL));
        for (int i = 0; i < RB; ++i)
          for (int j = 0; j < SB; ++j)
            b.CreateStore(fmuladd(qv[i], kv[j], b.CreateLoad(vt(VL), st.accs[i * SB + j])), st.accs[i * SB + j]);
      });
      std::vector<Value*> in;
      for (int x = 0; x < NA; ++x) in.push_back(b.CreateLoad(vt(VL), st.accs[x]));
      std::vector<Value*> sums = transpose_reduce(in);
      // Lanes are dot products in accumulator order x = i * SB + j.
      int x0 = 0;
      for (Value* sv : sums) {
        int w = static_cast<int>(cast<FixedVectorType>(sv->getType())->getNumElements());
        for (int off = 0; off < w; off += std::min(w, SB)) {
          int len = std::min(w, SB);
          int x = x0 + off, i = x / SB, j = x % SB;
          std::vector<int> idx;
          for (int l = 0; l < len; ++l) idx.push_back(off + l);
          Value* piece = len == w ? sv : b.CreateShuffleVector(sv, idx);
          Value* row = b.CreateMul(b.CreateAdd(rb, c64(i)), c64(TK));
          storev(piece, gepf(st.Pbuf, b.CreateAdd(row, b.CreateAdd(sb, c64(j)))));
        }
        x0 += w;
      }
    });
  });
}

// O[r] = O[r] * corr[r] + sum_j P[r][j] v_{s0+j}: RB rows x HB vectors of
// head_dim per register block, held across a loop over the tile's TK slots.
// Invalid slots may hold anything (unwritten cache memory, NaN included):
// their values are zeroed by the validity bits, so p = 0 never meets a NaN.
// A block of fewer rows than pv_rows (a tile whose row count has fewer
// factors of two, as at an odd G) spends the accumulators the missing rows
// leave on more vectors, up to 4: with 16 registers, 2 rows x 2 vectors
// took 0.99-1.17x the time of 2 x 4 on 4B's decode rows when they ran this
// loop, tiles of 2 rows (AMD EPYC Zen 4, --isa avx2/ssse3/scalar, warm
// rows, 3 alternations; decode tiles take emit_pv_decode now).
void Emitter::emit_pv_tile(const CoreState& st, int R) {
  const int TK = tiling_.tk, RB = pow2_divisor(R, tiling_.pv_rows);
  const int HB = pow2_divisor(NV, std::min(4, tiling_.pv_vecs * (tiling_.pv_rows / RB)));
  for_(c64(0), c64(R), RB, [&](Value* rb) {
    for_(c64(0), c64(NV), HB, [&](Value* hc) {
      std::vector<Value*> optr;
      for (int i = 0; i < RB; ++i) {
        Value* row = b.CreateAdd(rb, c64(i));
        Value* s = splat(VL, b.CreateLoad(f32, gepf(st.Corr, row)));
        for (int c = 0; c < HB; ++c) {
          Value* p =
              gepf(st.Oacc, b.CreateAdd(b.CreateMul(row, c64(H)), b.CreateMul(b.CreateAdd(hc, c64(c)), c64(VL))));
          optr.push_back(p);
          b.CreateStore(b.CreateFMul(loadv(p, VL), s), st.accs[i * HB + c]);
        }
      }
      for_(c64(0), c64(TK), 1, [&](Value* j) {
        Value* vb = b.CreateMul(b.CreateLoad(i64, b.CreateInBoundsGEP(i64, st.kslot, j)), c64(H));
        // A bit mask (-1 valid, 0 not) rather than a select: LLVM turns a
        // select on a scalar condition into branches around the loads.
        Type* vi32 = FixedVectorType::get(i32, VL);
        Value* okv = b.CreateVectorSplat(VL, b.CreateLoad(i32, b.CreateInBoundsGEP(i32, st.kv_t, j)));
        std::vector<Value*> vv;
        for (int c = 0; c < HB; ++c) {
          Value* e = b.CreateMul(b.CreateAdd(hc, c64(c)), c64(VL));
          Value* bits = b.CreateBitCast(load_kv(st.V, b.CreateAdd(vb, e), VL), vi32);
          vv.push_back(b.CreateBitCast(b.CreateAnd(bits, okv), vt(VL)));
        }
        for (int i = 0; i < RB; ++i) {
          Value* pij =
              b.CreateLoad(f32, gepf(st.Pbuf, b.CreateAdd(b.CreateMul(b.CreateAdd(rb, c64(i)), c64(TK)), j)));
          Value* ps = splat(VL, pij);
          for (int c = 0; c < HB; ++c) {
            Value* acc = st.accs[i * HB + c];
            b.CreateStore(fmuladd(ps, vv[c], b.CreateLoad(vt(VL), acc)), acc);
          }
        }
      });
      for (int x = 0; x < RB * HB; ++x) storev(b.CreateLoad(vt(VL), st.accs[x]), optr[x]);
    });
  });
}

// Asks for `lines` lines (64 bytes each) from KV element `elem` of `base`
// on, into L1 (locality 3) or L2 (2).
void Emitter::prefetch_lines(Value* base, Value* elem, int lines, int locality) {
  Value* p = b.CreateGEP(bf16_ ? i16 : f32, base, elem);
  for (int l = 0; l < lines; ++l)
    b.CreateIntrinsic(Intrinsic::prefetch, {ptr}, {b.CreateGEP(i8, p, c64(int64_t(l) * 64)), c32(0), c32(locality), c32(1)});
}

// The decode tile's S = Q K^T (SPEC 1.3 step E for one token's G rows): one
// key at a time, each K row read whole and in address order, two
// accumulators per row, then a horizontal sum. The register blocks of
// emit_qk_tile walk four K rows side by side, which a hardware prefetcher
// follows less well on a stream from DRAM; this is the Highway decode
// core's loop (templates/attention-inl.h, DecodeLogits). Per key, the first
// row block asks for the K row st.pf_ahead elements ahead, and the V row too
// when `ask_v` (into L1; into L2, emit_pv_decode asks for V).
void Emitter::emit_qk_decode(const CoreState& st, int R, int locality, bool ask_v) {
  const int TK = tiling_.tk, RB = pow2_divisor(R, 4), U = NV % 2 == 0 ? 2 : 1;
  const int lines = (H * (bf16_ ? 2 : 4) + 63) / 64;
  for_(c64(0), c64(R), RB, [&](Value* rb) {
    std::vector<Value*> qr;
    for (int i = 0; i < RB; ++i)
      qr.push_back(b.CreateLoad(ptr, b.CreateInBoundsGEP(ptr, st.qrow, b.CreateAdd(rb, c64(i)))));
    for_(c64(0), c64(TK), 1, [&](Value* j) {
      Value* kb = b.CreateMul(b.CreateLoad(i64, b.CreateInBoundsGEP(i64, st.kslot, j)), c64(H));
      if_(b.CreateICmpEQ(rb, c64(0)), [&] {
        Value* e = b.CreateAdd(kb, st.pf_ahead);
        prefetch_lines(st.K, e, lines, locality);
        if (ask_v) prefetch_lines(st.V, e, lines, locality);
      });
      for (int x = 0; x < RB * U; ++x) b.CreateStore(splatf(VL, 0.f), st.accs[x]);
      for_(c64(0), c64(NV), U, [&](Value* c) {
        for (int u = 0; u < U; ++u) {
          Value* e = b.CreateMul(b.CreateAdd(c, c64(u)), c64(VL));
          Value* kv = load_kv(st.K, b.CreateAdd(kb, e), VL);
          for (int i = 0; i < RB; ++i) {
            Value* acc = st.accs[i * U + u];
            b.CreateStore(fmuladd(loadv(gepf(qr[i], e), VL), kv, b.CreateLoad(vt(VL), acc)), acc);
          }
        }
      });
      for (int i = 0; i < RB; ++i) {
        Value* sum = b.CreateLoad(vt(VL), st.accs[i * U]);
        if (U == 2) sum = b.CreateFAdd(sum, b.CreateLoad(vt(VL), st.accs[i * U + 1]));
        Value* row = b.CreateMul(b.CreateAdd(rb, c64(i)), c64(TK));
        b.CreateStore(hreduce(sum, false), gepf(st.Pbuf, b.CreateAdd(row, j)));
      }
    });
  });
}

// The decode tile's O = O * corr + P V (SPEC 1.3 step I): four keys per
// pass over O (which stays in L1: G rows of head_dim floats), each pass
// reading the four V rows whole and in address order, where emit_pv_tile
// walks the tile's V rows a column block at a time. Invalid slots' values
// are zeroed by their validity bits, as there. With `locality` (into L2),
// the V rows st.pf_ahead elements ahead of the pass are asked for a few
// lines per step over head_dim, so the requests run through the whole pass
// (the Highway decode core's DecodePV).
void Emitter::emit_pv_decode(const CoreState& st, int R, int locality) {
  const int TK = tiling_.tk, RB = pow2_divisor(R, 4), KB = pow2_divisor(TK, 4);
  const int lines = (KB * H * (bf16_ ? 2 : 4) + 63) / 64, per = (lines + NV - 1) / NV;
  Type* vi32 = FixedVectorType::get(i32, VL);
  for_(c64(0), c64(R), 1, [&](Value* r) {
    Value* s = splat(VL, b.CreateLoad(f32, gepf(st.Corr, r)));
    for_(c64(0), c64(NV), 1, [&](Value* c) {
      Value* p = gepf(st.Oacc, b.CreateAdd(b.CreateMul(r, c64(H)), b.CreateMul(c, c64(VL))));
      storev(b.CreateFMul(loadv(p, VL), s), p);
    });
  });
  for_(c64(0), c64(TK), KB, [&](Value* j0) {
    std::vector<Value*> vb, okv;
    for (int j = 0; j < KB; ++j) {
      Value* jj = b.CreateAdd(j0, c64(j));
      vb.push_back(b.CreateMul(b.CreateLoad(i64, b.CreateInBoundsGEP(i64, st.kslot, jj)), c64(H)));
      okv.push_back(b.CreateVectorSplat(VL, b.CreateLoad(i32, b.CreateInBoundsGEP(i32, st.kv_t, jj))));
    }
    Value* pf_at = b.CreateAdd(vb[0], st.pf_ahead);
    for_(c64(0), c64(R), RB, [&](Value* rb) {
      std::vector<Value*> pij;
      for (int i = 0; i < RB; ++i)
        for (int j = 0; j < KB; ++j) {
          Value* row = b.CreateMul(b.CreateAdd(rb, c64(i)), c64(TK));
          pij.push_back(splat(VL, b.CreateLoad(f32, gepf(st.Pbuf, b.CreateAdd(row, b.CreateAdd(j0, c64(j)))))));
        }
      for_(c64(0), c64(NV), 1, [&](Value* c) {
        if (locality)
          if_(b.CreateICmpEQ(rb, c64(0)), [&] {
            Value* e = b.CreateAdd(pf_at, b.CreateMul(c, c64(int64_t(per) * 64 / (bf16_ ? 2 : 4))));
            prefetch_lines(st.V, e, per, locality);
          });
        Value* e = b.CreateMul(c, c64(VL));
        std::vector<Value*> vv;
        for (int j = 0; j < KB; ++j) {
          Value* bits = b.CreateBitCast(load_kv(st.V, b.CreateAdd(vb[j], e), VL), vi32);
          vv.push_back(b.CreateBitCast(b.CreateAnd(bits, okv[j]), vt(VL)));
        }
        for (int i = 0; i < RB; ++i) {
          Value* p = gepf(st.Oacc, b.CreateAdd(b.CreateMul(b.CreateAdd(rb, c64(i)), c64(H)), e));
          Value* o = loadv(p, VL);
          for (int j = 0; j < KB; ++j) o = fmuladd(pij[i * KB + j], vv[j], o);
          storev(o, p);
        }
      });
    });
  });
}

void Emitter::emit_core() {
  new_function(kCoreName);
  using A = g3_core_args;
  CoreState st;
  Value* a = st.a = fn_->getArg(0);
  st.T = field(a, offsetof(A, T), i64);
  st.q = field(a, offsetof(A, q), ptr);
  st.qs = field(a, offsetof(A, q_stride), i64);
  st.K = field(a, offsetof(A, k), ptr);
  st.V = field(a, offsetof(A, v), ptr);
  st.S = field(a, offsetof(A, S), i64);
  st.out = field(a, offsetof(A, out), ptr);
  st.os = field(a, offsetof(A, out_stride), i64);
  st.lse = field(a, offsetof(A, lse), ptr);
  Value *T = st.T, *S = st.S;
  {
    // The decode prefetch hint (kernel_contract.h): bytes of K and V ahead,
    // else the default; in keys (at least one), then elements.
    Value* bytes = b.CreateSExt(field(a, offsetof(A, prefetch_bytes), i32), i64);
    bytes = b.CreateSelect(b.CreateICmpSGT(bytes, c64(0)), bytes, c64(int64_t(kDecodePrefetchBytes)));
    const int64_t row2 = 2 * int64_t(H) * (bf16_ ? 2 : 4);
    Value* keys = b.CreateUDiv(bytes, c64(row2));
    keys = b.CreateSelect(b.CreateICmpSGT(keys, c64(0)), keys, c64(1));
    st.pf_ahead = b.CreateMul(keys, c64(H));
    st.pf_l2 = b.CreateICmpEQ(field(a, offsetof(A, prefetch_level), i32), c32(G3_PREFETCH_L2));
  }

  const int G = key_.group, TK = tiling_.tk, TQmax = tiling_.tq;
  Type* vd = Type::getVoidTy(C);
  FunctionCallee rows_fn =
      M.getOrInsertFunction(kTileRowsHelper, FunctionType::get(vd, {ptr, i64, i64, i64, ptr, ptr}, false));
  FunctionCallee class_fn =
      M.getOrInsertFunction(kTileClassHelper, FunctionType::get(i32, {ptr, i64, i64, ptr, ptr, ptr}, false));
  FunctionCallee init_fn = M.getOrInsertFunction(kInitRowsHelper, FunctionType::get(vd, {i64, ptr, ptr}, false));
  FunctionCallee softmax_fn = M.getOrInsertFunction(
      kSoftmaxHelper,
      FunctionType::get(vd, {ptr, i64, i64, i64, i32, i64, ptr, ptr, ptr, ptr, ptr, ptr}, false));
  FunctionCallee finish_fn =
      M.getOrInsertFunction(kFinishRowHelper, FunctionType::get(vd, {ptr, f32, f32, i64, ptr, ptr}, false));

  // Scratch sized for the largest tile; shared by both tile shapes.
  const int Rmax = TQmax * G;
  st.Oacc = alloca_(f32, int64_t(Rmax) * H);
  st.Pbuf = alloca_(f32, int64_t(Rmax) * TK);
  st.Mrow = alloca_(f32, Rmax);
  st.Lrow = alloca_(f32, Rmax);
  st.Corr = alloca_(f32, Rmax);
  st.qrow = alloca_(ptr, Rmax, 8);
  st.rbounds = alloca_(i64, 2 * int64_t(Rmax), 8);  // g3_row_bounds: {i32 lo, i32 hi, i64 smax}
  st.rowset = alloca_(i64, 4, 8);                    // g3_row_set: 4 x i32, 2 x i64
  st.kp_t = alloca_(i32, TK);
  st.kv_t = alloca_(i32, TK);
  st.kslot = alloca_(i64, TK, 8);
  for (int i = 0; i < 16; ++i) st.accs.push_back(alloca_(vt(VL), 1));
  Value* S1 = b.CreateSub(S, c64(1));

  auto tile = [&](Value* t0, int TQ) {
    const int R = TQ * G;
    // Row r = tt * G + g: query token t0 + tt, group head g. Tokens past T
    // (a partial last tile) are clamped to T - 1: they redo that token's
    // work and are not stored, which is cheaper than running the tail token
    // by token.
    b.CreateCall(rows_fn, {a, t0, c64(TQ), c64(G), st.rbounds, st.rowset});
    for_(c64(0), c64(TQ), 1, [&](Value* tt) {
      Value* tok = b.CreateAdd(t0, tt);
      tok = b.CreateSelect(b.CreateICmpSLT(tok, T), tok, b.CreateSub(T, c64(1)));
      for (int g = 0; g < G; ++g) {
        Value* r = b.CreateAdd(b.CreateMul(tt, c64(G)), c64(g));
        Value* qp = gepf(st.q, b.CreateAdd(b.CreateMul(tok, st.qs), c64(int64_t(g) * H)));
        b.CreateStore(qp, b.CreateInBoundsGEP(ptr, st.qrow, r));
      }
    });
    b.CreateCall(init_fn, {c64(R), st.Mrow, st.Lrow});
    for_(c64(0), c64(int64_t(R) * NV), 1, [&](Value* i) {
      storev(splatf(VL, 0.f), gepf(st.Oacc, b.CreateMul(i, c64(VL))));
    });

    for_(c64(0), S, TK, [&](Value* s0) {
      Value* cls = b.CreateCall(class_fn, {a, s0, c64(TK), st.rowset, st.kp_t, st.kv_t});
      if_(b.CreateICmpNE(cls, c32(G3_TILE_SKIP)), [&] {
        // Slots past S read slot S - 1 (every load stays in bounds); they
        // are invalid for the softmax and zeroed for P V.
        for_(c64(0), c64(TK), 1, [&](Value* j) {
          Value* s = b.CreateAdd(s0, j);
          b.CreateStore(b.CreateSelect(b.CreateICmpSLT(s, S), s, S1), b.CreateInBoundsGEP(i64, st.kslot, j));
        });
        // Decode: the hint's cache level, one copy of each loop per level.
        if (TQ == 1) {
          if_(st.pf_l2, [&] { emit_qk_decode(st, R, 2, false); });
          if_(b.CreateNot(st.pf_l2), [&] { emit_qk_decode(st, R, 3, true); });
        } else {
          emit_qk_tile(st, R);
        }
        Value* full = b.CreateZExt(b.CreateICmpEQ(cls, c32(G3_TILE_FULL)), i32);
        b.CreateCall(softmax_fn, {st.Pbuf, c64(TK), c64(R), c64(TK), full, s0, st.kp_t, st.kv_t, st.rbounds,
                                  st.Mrow, st.Lrow, st.Corr});
        if (TQ == 1) {
          if_(st.pf_l2, [&] { emit_pv_decode(st, R, 2); });
          if_(b.CreateNot(st.pf_l2), [&] { emit_pv_decode(st, R, 0); });
        } else {
          emit_pv_tile(st, R);
        }
      });
    });

    // Rows of real tokens: out = O / l and lse (the shared row finish).
    for_(c64(0), c64(R), 1, [&](Value* r) {
      Value* t = b.CreateAdd(t0, b.CreateUDiv(r, c64(G)));
      Value* g = b.CreateURem(r, c64(G));
      if_(b.CreateICmpSLT(t, T), [&] {
        Value* orow = gepf(st.out, b.CreateAdd(b.CreateMul(t, st.os), b.CreateMul(g, c64(H))));
        Value* lp = b.CreateSelect(b.CreateICmpEQ(st.lse, ConstantPointerNull::get(ptr)), ConstantPointerNull::get(ptr),
                                   b.CreateGEP(f32, st.lse, b.CreateAdd(b.CreateMul(t, c64(G)), g)));
        b.CreateCall(finish_fn, {gepf(st.Oacc, b.CreateMul(r, c64(H))), b.CreateLoad(f32, gepf(st.Mrow, r)),
                                 b.CreateLoad(f32, gepf(st.Lrow, r)), c64(H), orow, lp});
      });
    });
  };

  // Tiles of TQ tokens while at least a quarter of a tile remains (the last
  // one clamped), then single tokens: decode (T = 1) takes only the second
  // loop and computes no wasted rows.
  Value* tstart = c64(0);
  if (TQmax > 1) {
    Value* big_end = b.CreateSub(T, c64(std::max(1, TQmax / 4)));
    for_(c64(0), big_end, TQmax, [&](Value* t0) { tile(t0, TQmax); });
    Value* nb = b.CreateSDiv(b.CreateAdd(big_end, c64(TQmax - 1)), c64(TQmax));
    Value* ts = b.CreateMul(nb, c64(TQmax));
    ts = b.CreateSelect(b.CreateICmpSGT(ts, T), T, ts);
    tstart = b.CreateSelect(b.CreateICmpSGT(big_end, c64(0)), ts, c64(0));
  }
  for_(tstart, T, 1, [&](Value* t0) { tile(t0, 1); });
  b.CreateRetVoid();
}

}  // namespace

void emit_kernels(Module& m, const KernelKey& key, const IrTarget& t) {
  Emitter e(m, key, t);
  e.emit_qk();
  e.emit_core();
}

}  // namespace g3::llvmjit
