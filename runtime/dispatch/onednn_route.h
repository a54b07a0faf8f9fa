// Which provider runs a layer's projection stage (SPEC 1.3 steps A and J):
// Highway's GEMM/GEMV (the kernel table's `gemm`, templates/projections-inl.h)
// or oneDNN's matmul (onednn_matmul.h). The choice is per layer, per phase
// (decode-sized calls or prefill-sized ones, by rows B x T) and per compute
// mode, because which one wins depends on all three and on the CPU.
//
// A layer asks for a provider by name or for `auto`. Auto reads a table of
// (phase, compute mode) -> provider: its defaults are the rule measured on
// the machine this was written on (below), and `g3attn tune` (profile.h)
// may overwrite entries with what it measured on the CPU at hand through
// set_projection_provider, before the layers are prepared.
//
// The default rule (measured on 2 cores of an Intel Xeon with AMX, the
// machine the issue names Emerald Rapids; README's "Compute modes" section
// has the figures):
//   - prefill (more than kProjDecodeMaxRows rows), bf16 compute: oneDNN,
//     where this process may use AMX tiles (there it ran the 4B projections
//     of 512 tokens 5.4x faster than our f32 GEMM); elsewhere Highway, until
//     a profile says otherwise;
//   - prefill, f32 compute: Highway. oneDNN's f32 matmul measured 1.3-1.5x
//     faster here, but it needs the weights widened to an f32 copy (twice
//     the memory of the bf16 ones) beside the packed ones, which a default
//     should not do unasked; a tune profile that measures it faster picks it;
//   - decode (at most kProjDecodeMaxRows rows), both modes: Highway's GEMV,
//     which streams the weights once per call (oneDNN's matmul measured
//     1.5-6x slower at M = 1).
// Auto keeps the layer's own GEMM (never oneDNN) when that GEMM is the
// reference (the oracle runs the whole block) or when --isa caps the ISA
// below this CPU's best (oneDNN would not honour the cap).
#pragma once
#include <cstdint>
#include <string>

#include "generator/kernel_key.h"
#include "runtime/dispatch/profile.h"

namespace g3 {

enum class ProjProvider { Highway, Onednn };
const char* to_string(ProjProvider p);  // "highway" | "onednn"

// What a layer asks for.
enum class ProjectionRoute { Auto, Highway, Onednn };
const char* to_string(ProjectionRoute r);  // "auto" | "highway" | "onednn"
// Validates a --proj value (InputError naming the flag and the valid names).
ProjectionRoute parse_projection_route(const std::string& name, const std::string& flag = "--proj");

// Calls of at most this many rows are decode-class: Highway's GEMV path
// serves up to 16 rows (G3_PROJ_GEMV_MAX_ROWS), and up to there oneDNN's
// matmul measured slower.
inline constexpr int64_t kProjDecodeMaxRows = 16;
inline Phase projection_phase(int64_t rows) { return rows <= kProjDecodeMaxRows ? Phase::Decode : Phase::Prefill; }

// The table auto reads: the default rule above, or what was set.
ProjProvider projection_provider(Phase phase, DType compute);
// The default rule alone (ignores what was set).
ProjProvider default_projection_provider(Phase phase, DType compute);
// The hook for a tune profile: auto then picks `p` for (phase, compute) in
// layers prepared afterwards; `source` says where the choice came from
// (plan prints it). Thread-safe.
void set_projection_provider(Phase phase, DType compute, ProjProvider p, const std::string& source = "profile");
// Back to the default rule.
void reset_projection_providers();
// "default rule" or the source given to set_projection_provider.
std::string projection_provider_source(Phase phase, DType compute);

// What a layer runs for one phase: its request, or for auto the table,
// except that auto keeps the layer's own GEMM when `gemm_backend` (the
// backend of its gemm stage) is the reference or `isa_capped`, and when
// oneDNN cannot serve the compute mode here. A request for onednn is an
// InputError naming the reason when the gemm backend is the reference, when
// the ISA is capped, or when oneDNN cannot serve the compute mode here.
ProjProvider resolve_projection(ProjectionRoute request, Phase phase, DType compute, const std::string& gemm_backend,
                                bool isa_capped);
// The same, with where the choice came from, as `g3attn plan` prints it:
// "--proj highway", "default rule", "profile: onednn 1.52x highway", "auto
// keeps the reference's GEMM", ...
struct ProjectionChoice {
  ProjProvider provider = ProjProvider::Highway;
  std::string source;
};
ProjectionChoice explain_projection(ProjectionRoute request, Phase phase, DType compute,
                                    const std::string& gemm_backend, bool isa_capped);

// The rule in a few lines, for --help texts.
std::string projection_rule_text();

}  // namespace g3
