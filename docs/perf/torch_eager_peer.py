#!/usr/bin/env python3
"""A peer for README's performance section: the attention core of the bench's
prefill and decode rows, computed the way Hugging Face transformers' Gemma 3
"eager" attention does it in PyTorch (K and V repeated to every query head,
Q K^T plus the mask, softmax in f32, then P V). Not part of g3attn and not
run by its tests: Debian 12's python3-torch (1.13, no fused attention) with
libopenblas0-pthread installed, so that its BLAS is OpenBLAS, not the
reference BLAS.

    /usr/bin/python3 docs/perf/torch_eager_peer.py [THREADS]

Queries are scaled by head_dim^-1/2 up front (Gemma 3 scales by
query_pre_attn_scalar^-1/2, the same cost). Local layers get only the keys
some query of the call may see (the window plus the call), as a sliding
cache holds them. GFLOP/s follow the bench's rule: 4 x head_dim x query
heads x visible query-key pairs.
"""
import statistics
import sys
import time

import torch

# model: (query heads, KV heads, head_dim, window)
MODELS = {"1b": (4, 1, 256, 512), "4b": (8, 4, 256, 1024), "27b": (32, 16, 128, 1024)}


def core(q, k, v, mask):
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    p = torch.softmax(torch.matmul(q, k.transpose(2, 3)) + mask, dim=-1, dtype=torch.float32)
    return torch.matmul(p, v)


def measure(model, kind, new, context, repeat):
    n, nkv, h, w = MODELS[model]
    first = max(0, context - new - w + 1) if kind == "local" else 0
    qpos = torch.arange(context - new, context)[:, None]
    kpos = torch.arange(first, context)[None, :]
    visible = kpos <= qpos
    if kind == "local":
        visible &= kpos > qpos - w
    mask = torch.where(visible, 0.0, float("-inf"))[None, None]
    q = torch.randn(1, n, new, h) * h**-0.5
    k = torch.randn(1, nkv, context - first, h)
    v = torch.randn(1, nkv, context - first, h)
    core(q, k, v, mask)  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        core(q, k, v, mask)
        times.append(time.perf_counter() - t)
    ms = statistics.median(times) * 1e3
    return ms, 4 * h * n * int(visible.sum()) / (ms * 1e-3) / 1e9


def main():
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("phase    model  kind    new  context  ms_median  GFLOP/s")
    for phase, new, models, contexts, repeat in (("prefill", 512, ("1b", "4b", "27b"), (1024, 4096, 32768), 3),
                                                 ("decode", 1, ("1b", "4b"), (4096, 32768), 21)):
        for model in models:
            for kind in ("global", "local"):
                for context in contexts:
                    ms, gflops = measure(model, kind, new, context, repeat)
                    print(f"{phase:8} {model:6} {kind:7} {new:4} {context:8} {ms:10.3f} {gflops:8.1f}", flush=True)


if __name__ == "__main__":
    main()
