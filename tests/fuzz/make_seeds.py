#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz harnesses (tests/fuzz/corpus/).

Small valid files (and a few near-valid ones that exercise error paths) for
the .npy reader, the safetensors reader and the config.json parser, plus the
golden cases' config.json files and small .npy files. The output is checked
in; rerun this script only to change the seeds. Standard library only.

    python3 tests/fuzz/make_seeds.py [GOLDEN_DIR]

GOLDEN_DIR defaults to the tests' rule (tests/golden/README.md):
$G3ATTN_GOLDEN_DIR, else ../shared/golden beside the project, else the
in-repo subset tests/golden (whose seeds are then the only golden ones).
"""
import json
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
def default_golden():
    if os.environ.get("G3ATTN_GOLDEN_DIR"):
        return os.environ["G3ATTN_GOLDEN_DIR"]
    beside = os.path.join(ROOT, "..", "shared", "golden")
    return beside if os.path.isdir(beside) else os.path.join(ROOT, "tests", "golden")


GOLDEN = sys.argv[1] if len(sys.argv) > 1 else default_golden()
MAX_SEED = 10 * 1024  # seeds stay small so the fuzzer mutates headers, not data


def out(kind, name, data):
    d = os.path.join(HERE, "corpus", kind)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) <= MAX_SEED, (name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- .npy -----------------------------------------------------------------
def npy(descr, shape, payload, version=(1, 0), fortran=False, pad=True, header=None):
    if header is None:
        shp = "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
        header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, "True" if fortran else "False", shp)
    pre = 10 if version[0] == 1 else 12
    if pad:
        header += " " * ((64 - (pre + len(header) + 1) % 64) % 64)
    header += "\n"
    h = header.encode("latin1")
    if version[0] == 1:
        lead = b"\x93NUMPY" + bytes(version) + struct.pack("<H", len(h))
    else:
        lead = b"\x93NUMPY" + bytes(version) + struct.pack("<I", len(h))
    return lead + h + payload


def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


def i32(vals):
    return struct.pack("<%di" % len(vals), *vals)


out("npy", "f32_1d.npy", npy("<f4", [3], f32([1.0, -2.5, 3.25])))
out("npy", "f32_2x3.npy", npy("<f4", [2, 3], f32([0, 1, 2, 3, 4, 5])))
out("npy", "f32_1x2x4.npy", npy("<f4", [1, 2, 4], f32([0.5] * 8)))
out("npy", "f32_scalar_0d.npy", npy("<f4", [], f32([7.0])))
out("npy", "f32_empty_0.npy", npy("<f4", [0], b""))
out("npy", "f32_empty_2x0x5.npy", npy("<f4", [2, 0, 5], b""))
out("npy", "f32_nan_inf.npy", npy("<f4", [4], f32([float("nan"), float("inf"), -float("inf"), -0.0])))
out("npy", "i32_2x3.npy", npy("<i4", [2, 3], i32([0, 1, 2, -1, 2147483647, -2147483648])))
out("npy", "i32_mask_1x4.npy", npy("<i4", [1, 4], i32([1, 1, 0, 0])))
out("npy", "f32_v2.npy", npy("<f4", [2], f32([1, 2]), version=(2, 0)))
out("npy", "i32_v3.npy", npy("<i4", [2], i32([1, 2]), version=(3, 0)))
out("npy", "f32_unpadded.npy", npy("<f4", [2], f32([1, 2]), pad=False))
out("npy", "f32_double_quotes.npy", npy(None, None, f32([1, 2]), header='{"descr": "<f4", "fortran_order": False, "shape": (2,)}'))
out("npy", "f32_reordered_keys.npy", npy(None, None, f32([1, 2]), header="{'shape': (2,), 'fortran_order': False, 'descr': '<f4'}"))
# Valid headers of things we reject on purpose: the error path must be clean.
out("npy", "reject_f8.npy", npy("<f8", [1], struct.pack("<d", 1.0)))
out("npy", "reject_big_endian.npy", npy(">f4", [1], struct.pack(">f", 1.0)))
out("npy", "reject_i8_positions.npy", npy("<i8", [1, 2], struct.pack("<2q", 2**31, -1)))
out("npy", "reject_fortran.npy", npy("<f4", [2, 2], f32([1, 2, 3, 4]), fortran=True))
out("npy", "reject_truncated_data.npy", npy("<f4", [4], f32([1, 2])))
out("npy", "reject_trailing_data.npy", npy("<f4", [1], f32([1, 2])))
out("npy", "reject_huge_shape.npy", npy("<f4", [1 << 30, 1 << 30], b""))
out("npy", "reject_header_only.npy", npy("<f4", [2, 3], b""))

# ---- safetensors ------------------------------------------------------------
def st(tensors, metadata=None, raw_header=None):
    """tensors: list of (name, dtype, shape, bytes); offsets are laid out in order."""
    hdr, blob = {}, b""
    if metadata is not None:
        hdr["__metadata__"] = metadata
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = raw_header.encode() if raw_header is not None else json.dumps(hdr, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + blob


def bf16(vals):
    return b"".join(struct.pack("<f", v)[2:] for v in vals)


def f16(vals):
    return struct.pack("<%de" % len(vals), *vals)


out("safetensors", "f32_one.safetensors", st([("w", "F32", [2, 2], f32([1, 2, 3, 4]))]))
out("safetensors", "bf16_one.safetensors", st([("w", "BF16", [4], bf16([1, -2, 0.5, 3]))]))
out("safetensors", "f16_special.safetensors",
    st([("h", "F16", [6], f16([1.0, -0.0, 6.0e-8, 65504.0, float("inf"), float("nan")]))]))
out("safetensors", "empty_header.safetensors", st([]))
out("safetensors", "metadata.safetensors", st([("a", "F32", [1], f32([1]))], metadata={"format": "pt"}))
out("safetensors", "scalar_and_empty.safetensors",
    st([("s", "F32", [], f32([3])), ("e", "BF16", [0, 7], b""), ("v", "F16", [2], f16([1, 2]))]))
# A miniature Gemma 3 layer (D=8, N=2, Nkv=1, dh=4) under HF names, bf16.
L = "model.layers.0."
D, N, K, H = 8, 2, 1, 4
layer = [
    (L + "input_layernorm.weight", "BF16", [D], bf16([0.1] * D)),
    (L + "self_attn.q_proj.weight", "BF16", [N * H, D], bf16([0.01 * i for i in range(N * H * D)])),
    (L + "self_attn.k_proj.weight", "BF16", [K * H, D], bf16([0.02 * i for i in range(K * H * D)])),
    (L + "self_attn.v_proj.weight", "BF16", [K * H, D], bf16([-0.01 * i for i in range(K * H * D)])),
    (L + "self_attn.o_proj.weight", "BF16", [D, N * H], bf16([0.03] * (D * N * H))),
    (L + "self_attn.q_norm.weight", "BF16", [H], bf16([0.0] * H)),
    (L + "self_attn.k_norm.weight", "BF16", [H], bf16([0.0] * H)),
    (L + "post_attention_layernorm.weight", "BF16", [D], bf16([0.2] * D)),
]
out("safetensors", "mini_layer.safetensors", st(layer, metadata={"format": "pt"}))
# Near-valid files whose rejection must be clean.
out("safetensors", "reject_overlap.safetensors", st([], raw_header='{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                                  '"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}') + f32([1]))
out("safetensors", "reject_gap.safetensors", st([], raw_header='{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}') + f32([1, 2]))
out("safetensors", "reject_i64.safetensors", st([("p", "I64", [1], struct.pack("<q", 5))]))
out("safetensors", "reject_truncated.safetensors", st([("w", "F32", [4], f32([1, 2, 3, 4]))])[:-6])
out("safetensors", "reject_header_only.safetensors", st([("w", "F32", [2, 2], f32([1, 2, 3, 4]))])[:-16])
out("safetensors", "reject_duplicate_key.safetensors",
    st([], raw_header='{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}') + f32([1]))
out("safetensors", "reject_huge_shape.safetensors",
    st([], raw_header='{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}') + f32([1]))

# ---- config.json ------------------------------------------------------------
seen = set()
if os.path.isdir(GOLDEN):
    for case in sorted(os.listdir(GOLDEN)):
        c = os.path.join(GOLDEN, case, "config.json")
        if not os.path.isfile(c):
            continue
        text = open(c, "rb").read()
        if text not in seen:  # several cases share one geometry
            seen.add(text)
            out("config", "golden_" + case + ".json", text)
        # Their positions and masks are good npy seeds too (x.npy is mostly data).
        for f in ("positions.npy", "attention_mask.npy"):
            p = os.path.join(GOLDEN, case, f)
            if os.path.isfile(p) and os.path.getsize(p) <= MAX_SEED:
                out("npy", "golden_" + case + "_" + f, open(p, "rb").read())
else:
    print("note: no golden dir at", GOLDEN, "- golden seeds skipped", file=sys.stderr)

base = {"model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 26, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 512,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rms_norm_eps": 1e-06,
        "max_position_embeddings": 32768, "sliding_window_pattern": 6, "rope_scaling": None}
out("config", "hf_1b_legacy_pattern.json", json.dumps(base, indent=1))
v5 = dict(base)
del v5["rope_theta"], v5["rope_local_base_freq"], v5["sliding_window_pattern"], v5["rope_scaling"]
v5["layer_types"] = ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2
v5["num_hidden_layers"] = 8
v5["rope_parameters"] = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
out("config", "hf_v5_rope_parameters.json", json.dumps(v5, indent=1))
out("config", "hf_4b_nested_text_config.json", json.dumps(
    {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
     "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "num_hidden_layers": 34,
                     "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 1024},
     "vision_config": {"model_type": "siglip_vision_model"}}, indent=1))
flat = dict(base)
flat["rope_parameters"] = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}
flat["layer_index"] = 5
flat["hidden_size"] = 1152.0
out("config", "hf_flat_rope_parameters_float_ints.json", json.dumps(flat))
bad = dict(base)
bad["num_hidden_layers"] = 1000000000
out("config", "reject_1e9_layers.json", json.dumps(bad))
bad = dict(base)
bad["head_dim"] = 1 << 30
out("config", "reject_head_dim_2p30.json", json.dumps(bad))
bad = dict(base)
bad["attn_logit_softcapping"] = 50.0
out("config", "reject_softcap.json", json.dumps(bad))
out("config", "reject_not_object.json", "[1, 2, 3]")
out("config", "reject_truncated.json", json.dumps(base)[:100])
print("seeds written under", os.path.join(HERE, "corpus"))
