/* The structured mask of kernel_contract.h, written once.
 *
 * Every attention core (the scalar reference's contract kernel, the Highway
 * templates, the Xbyak tile loop, the LLVM JIT through its helpers) decides
 * which key slots a query row sees with these functions, so the rule cannot
 * drift between backends. The rule (SPEC 1.4 and 1.6) is stated in
 * kernel_contract.h; here it is turned into bounds:
 *
 *   a row sees slot s  iff  kvalid[s] && lo <= kpos[s] <= hi && s <= smax
 *
 * with, for query t at position q and window W (0 = global):
 *   lo   = q - W + 1                       (INT32_MIN without a window)
 *   hi   = q                               G3_CAUSAL_POSITIONS
 *        = q + W - 1 (INT32_MAX if W = 0)  G3_CAUSAL_SLOTS (the window is symmetric)
 *   smax = INT64_MAX                       G3_CAUSAL_POSITIONS
 *        = t + causal_offset               G3_CAUSAL_SLOTS
 * Bounds are clamped to int32, which is exact because kpos is int32.
 *
 * Tiles of keys are summarised by the stored positions of their valid slots
 * and a set of rows by the extremes of its bounds, so a whole tile can be
 * classified against a block of rows in O(1): hidden from every row (skip,
 * which makes a local layer cost O(T x W)), visible to every row in full (no
 * per-element mask), or partial.
 *
 * Plain C99 so generated sources and JIT helpers can include it too.
 */
#ifndef G3ATTN_MASK_RULE_H_
#define G3ATTN_MASK_RULE_H_

#include <stdint.h>

#include "kernel_contract.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What one query row may see. */
typedef struct g3_row_bounds {
  int32_t lo, hi;  /* visible stored positions, inclusive */
  int64_t smax;    /* last visible slot */
} g3_row_bounds;

/* A row that sees nothing (padding rows of a register tile). */
static inline g3_row_bounds g3_bounds_none(void) {
  g3_row_bounds r = {INT32_MAX, INT32_MIN, -1};
  return r;
}

static inline int32_t g3_clamp_i32(int64_t v) {
  return v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : (int32_t)v;
}

/* Bounds of query token t of a core call. */
static inline g3_row_bounds g3_bounds_of(const g3_core_args* a, int64_t t) {
  const int64_t q = a->qpos[t], w = a->window;
  g3_row_bounds r;
  r.lo = w > 0 ? g3_clamp_i32(q - w + 1) : INT32_MIN;
  if (a->causal == G3_CAUSAL_SLOTS) {
    r.hi = w > 0 ? g3_clamp_i32(q + w - 1) : INT32_MAX;
    r.smax = t + a->causal_offset;
  } else {
    r.hi = (int32_t)q;
    r.smax = INT64_MAX;
  }
  return r;
}

/* The per-element rule. */
static inline int g3_visible(g3_row_bounds r, int64_t s, int32_t kpos, uint8_t kvalid) {
  return kvalid != 0 && kpos >= r.lo && kpos <= r.hi && s <= r.smax;
}

/* The extremes of a set of rows' bounds. */
typedef struct g3_row_set {
  int32_t lo_min, lo_max, hi_min, hi_max;
  int64_t smax_min, smax_max;
} g3_row_set;

static inline g3_row_set g3_row_set_empty(void) {
  g3_row_set s = {INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
  return s;
}

static inline void g3_row_set_add(g3_row_set* s, g3_row_bounds r) {
  s->lo_min = r.lo < s->lo_min ? r.lo : s->lo_min;
  s->lo_max = r.lo > s->lo_max ? r.lo : s->lo_max;
  s->hi_min = r.hi < s->hi_min ? r.hi : s->hi_min;
  s->hi_max = r.hi > s->hi_max ? r.hi : s->hi_max;
  s->smax_min = r.smax < s->smax_min ? r.smax : s->smax_min;
  s->smax_max = r.smax > s->smax_max ? r.smax : s->smax_max;
}

static inline void g3_row_set_merge(g3_row_set* s, const g3_row_set* o) {
  s->lo_min = o->lo_min < s->lo_min ? o->lo_min : s->lo_min;
  s->lo_max = o->lo_max > s->lo_max ? o->lo_max : s->lo_max;
  s->hi_min = o->hi_min < s->hi_min ? o->hi_min : s->hi_min;
  s->hi_max = o->hi_max > s->hi_max ? o->hi_max : s->hi_max;
  s->smax_min = o->smax_min < s->smax_min ? o->smax_min : s->smax_min;
  s->smax_max = o->smax_max > s->smax_max ? o->smax_max : s->smax_max;
}

/* A tile of key slots [s0, s1), s1 = min(S, s0 + width). */
typedef struct g3_tile_info {
  int64_t s0, s1;
  int32_t kmin, kmax;  /* stored positions of its valid slots */
  uint8_t any;         /* some slot is valid */
  uint8_t all;         /* the tile has its full width and every slot is valid */
} g3_tile_info;

static inline g3_tile_info g3_tile_info_of(const g3_core_args* a, int64_t s0, int64_t width) {
  g3_tile_info t;
  t.s0 = s0;
  t.s1 = s0 + width < a->S ? s0 + width : a->S;
  t.kmin = INT32_MAX;
  t.kmax = INT32_MIN;
  t.any = 0;
  t.all = (uint8_t)(t.s1 - s0 == width);
  for (int64_t s = s0; s < t.s1; ++s) {
    if (a->kvalid[s]) {
      const int32_t p = a->kpos[s];
      t.kmin = p < t.kmin ? p : t.kmin;
      t.kmax = p > t.kmax ? p : t.kmax;
      t.any = 1;
    } else {
      t.all = 0;
    }
  }
  return t;
}

/* The summary of tile t followed by tile n (n->s0 == t->s1), in t. */
static inline void g3_tile_info_merge(g3_tile_info* t, const g3_tile_info* n) {
  t->s1 = n->s1;
  t->kmin = n->kmin < t->kmin ? n->kmin : t->kmin;
  t->kmax = n->kmax > t->kmax ? n->kmax : t->kmax;
  t->any = (uint8_t)(t->any | n->any);
  t->all = (uint8_t)(t->all & n->all);
}

enum { G3_TILE_SKIP = 0, G3_TILE_PARTIAL = 1, G3_TILE_FULL = 2 };

/* G3_TILE_SKIP: no row of the set sees any slot of the tile; G3_TILE_FULL:
 * every row sees every slot (per-element masking is not needed). */
static inline int g3_classify(const g3_tile_info* t, const g3_row_set* r) {
  if (!t->any || t->kmin > r->hi_max || t->kmax < r->lo_min || t->s0 > r->smax_max) return G3_TILE_SKIP;
  if (t->all && t->kmax <= r->hi_min && t->kmin >= r->lo_max && t->s1 - 1 <= r->smax_min) return G3_TILE_FULL;
  return G3_TILE_PARTIAL;
}

/* The last slot (exclusive) a tile starting at s0 may expose to a row, for
 * vector code that compares slot offsets inside the tile: offset j is
 * visible by the slot rule iff j < g3_slot_limit(r, s0). */
static inline int64_t g3_slot_limit(g3_row_bounds r, int64_t s0, int64_t width) {
  if (r.smax >= s0 + width) return width;
  return r.smax < s0 ? 0 : r.smax - s0 + 1;
}

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* G3ATTN_MASK_RULE_H_ */
