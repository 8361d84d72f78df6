#!/usr/bin/env python3
"""torch-anchors.py: what PyTorch does on the same device, as reference points for castle-bench.

Times, at each L, PyTorch's fused causal attention (torch.nn.functional.scaled_dot_product_attention,
is_causal=True; in a PyTorch older than 2.0, which lacks it, the same in plain operations, reported
as anchor=torch-math) forward and forward + backward in float32 and bfloat16, and the parallel form of CASTLE
written in PyTorch (docs/algorithm.md section 2: L x L matrices, float32, forward only, skipped where
its matrices would not fit the device's free memory).  On a CUDA device the times are CUDA events
around each call; elsewhere (the CPU) wall-clock times after a synchronising call.  Each is the median
of --repeat runs after one untimed run.

usage: tools/torch-anchors.py [--L 1024,4096,8192] [--batch 2] [--heads 16] [--d 64] [--repeat 7]
                              [--device cuda|cpu]

Lines look like castle-bench's, with anchor= first:
  anchor=sdpa op=forward dtype=fp32 B=2 H=16 L=4096 d=64 median_ms=2.335 device=cuda
exit status: 0 success, 1 PyTorch missing or a run failed, 2 bad usage."""

import argparse
import math
import sys
import time


def positive_list(text):
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {text!r}")
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {text!r}")
    return vals


def positive(text):
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def main():
    doc = __doc__.split("\n\n")
    ap = argparse.ArgumentParser(prog="torch-anchors.py", description=doc[1], epilog=doc[3],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--L", type=positive_list, default=[1024, 4096, 8192], help="sequence lengths")
    ap.add_argument("--batch", type=positive, default=2)
    ap.add_argument("--heads", type=positive, default=16)
    ap.add_argument("--d", type=positive, default=64, help="head dim")
    ap.add_argument("--repeat", type=positive, default=7, help="timed runs per measurement (median)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda where there is one")
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"torch-anchors.py: PyTorch is not importable ({e})", file=sys.stderr)
        return 1
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cuda" and not torch.cuda.is_available():
        print("torch-anchors.py: --device cuda, but PyTorch sees no CUDA device", file=sys.stderr)
        return 1
    B, H, d = a.batch, a.heads, a.d

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    def one_ms(fn):
        if dev == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            sync()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    def median_ms(fn, repeat):
        fn()  # untimed: allocations, kernel selection
        sync()
        times = sorted(one_ms(fn) for _ in range(repeat))
        return times[len(times) // 2]

    def castle_parallel(qu, ku, vu, qc, kc, vc):
        """o of CASTLE (window 0) by its parallel form, as docs/algorithm.md section 2 writes it."""
        L = qc.shape[-2]
        sc = 1.0 / math.sqrt(qc.shape[-1])
        causal = torch.ones(L, L, dtype=torch.bool, device=qc.device).tril()
        x = (sc * qc @ vu.transpose(-1, -2)).masked_fill(~causal, 0.0)  # X: j' <= t
        g = torch.sigmoid(sc * qu @ ku.transpose(-1, -2)).masked_fill(causal, 0.0)  # G: s < j'
        a = sc * qc @ kc.transpose(-1, -2) - F.silu(x @ g.transpose(-1, -2))
        return torch.softmax(a.masked_fill(~causal, float("-inf")), dim=-1) @ vc

    def causal_math(q, k, v):
        """Causal softmax attention in plain PyTorch operations (for a PyTorch without SDPA, < 2.0)."""
        L = q.shape[-2]
        causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        a = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~causal, float("-inf"))
        return torch.softmax(a, dim=-1) @ v

    if hasattr(F, "scaled_dot_product_attention"):
        attention, anchor = (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)), "sdpa"
    else:
        print(f"torch-anchors.py: PyTorch {torch.__version__} has no scaled_dot_product_attention; timing "
              "causal attention in plain operations instead (anchor=torch-math)", file=sys.stderr)
        attention, anchor = causal_math, "torch-math"

    def line(anchor, op, dtype, L, ms):
        print(f"anchor={anchor} op={op} dtype={dtype} B={B} H={H} L={L} d={d} median_ms={ms:.4f} device={dev}",
              flush=True)

    torch.manual_seed(0)
    for L in a.L:
        x = [torch.randn(B, H, L, d, device=dev) for _ in range(6)]
        grad = torch.randn(B, H, L, d, device=dev)
        for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            q, k, v = (t.to(dtype).requires_grad_() for t in x[3:])
            g = grad.to(dtype)
            line(anchor, "forward", name, L, median_ms(lambda: attention(q, k, v), a.repeat))
            line(anchor, "fwd+bwd", name, L, median_ms(lambda: attention(q, k, v).backward(g), a.repeat))
        # about six B x H x L x L float32 matrices live at once
        need = 6 * B * H * L * L * 4
        free = torch.cuda.mem_get_info()[0] if dev == "cuda" else need + 1
        if need < free and (dev == "cuda" or L <= 4096):
            with torch.no_grad():
                line("castle-parallel", "forward", "fp32", L, median_ms(lambda: castle_parallel(*x), min(a.repeat, 3)))
        del x, grad
        if dev == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
