// Head ranges: KV heads [j0, j1) of one layer with their query groups, run
// as a layer of their own. This is the building block of tensor parallelism
// (one range per rank, issue 16) and of the C API's head-range calls.
//
// Why a range is just a smaller layer. Query head n reads KV head n / G and
// nothing else (SPEC 1.3 step E: the groups are contiguous), so the query
// heads [j0 G, j1 G) with the KV heads [j0, j1) form a closed attention
// problem: a layer with (j1 - j0) G heads and j1 - j0 KV heads, whose q
// projection is the rows [j0 G dh, j1 G dh) of q_proj, whose k and v
// projections are the rows [j0 dh, j1 dh) of k_proj and v_proj, and whose
// cache holds only those KV heads. Its kernel key is the layer's (head_dim,
// group, window, RoPE and alpha do not change). Step J sums over heads:
// out = sum_n enc_n Wo[:, n], so the range's output projection over the
// columns [j0 G dh, j1 G dh) of o_proj is its share of the attention output,
// and the shares of ranges that cover every KV head once add up to the whole
// layer's attention output. The post-norm and the residual are not linear:
// they apply once, to that sum (SPEC 1.2 steps 3-4).
#pragma once
#include <vector>

#include "generator/catalogue.h"
#include "runtime/io/layer_weights.h"

namespace g3 {

struct HeadRange {
  int begin = 0, end = 0;  // KV heads [begin, end)
  int size() const { return end - begin; }
};

// Checks 0 <= begin < end <= Nkv (InputError naming the layer otherwise).
void check_head_range(const LayerSpec& full, HeadRange r);

// The range as a layer: the same index, kind, window, RoPE, alpha and
// hidden size, (end - begin) G heads and end - begin KV heads.
LayerSpec head_range_spec(const LayerSpec& full, HeadRange r);

// The range's weights cut from the whole layer's: q rows [begin G dh,
// end G dh), k and v rows [begin dh, end dh), o_proj columns [begin G dh,
// end G dh); the four norm vectors whole. Dtypes are kept.
LayerWeights slice_head_range(const LayerWeights& full, const LayerSpec& full_spec, HeadRange r);

// The same as slice_head_range(load_layer_weights(src, full), full, r), but
// only the range's rows (and o_proj's columns) are copied out of the
// checkpoint's mapping: what one rank of a tensor-parallel run needs. Shapes
// are checked against the whole layer, non-finite values in what is read are
// refused, as load_layer_weights does.
LayerWeights load_head_range_weights(const TensorSource& src, const LayerSpec& full, HeadRange r);

// `parts` ranges of equal size covering every KV head of a layer, in order;
// InputError listing the valid counts when parts does not divide Nkv.
std::vector<HeadRange> even_head_ranges(const LayerSpec& full, int parts);

}  // namespace g3
