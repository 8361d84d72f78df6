#!/usr/bin/env python3
"""What host memory costs castle.torch: for one attention shape, the time of a CASTLE (and causal)
forward + backward through castle.torch, against the time of the host <-> device copies alone that
such a step makes (inputs in, o and lse out; dO in, the gradients out), measured by making the same
copies with nothing to compute.

    python3 python/examples/transfer_cost.py --shape 8,4,128,32
"""

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import castle  # noqa: E402
import castle.torch as ct  # noqa: E402
from castle import _core  # noqa: E402


def best(fn, repeat):
    fn()
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(ts))


def copies(dev, host, n_in, n_out):
    """n_in uploads of host (one device buffer each) and n_out read-backs of the same size."""
    bufs = [_core.upload(dev, host) for _ in range(n_in)]
    for b in bufs[:1] * n_out:
        _core.Buffer.read(b.keep, dev, host.shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="8,4,128,32", help="B,H,L,d")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    shape = tuple(int(s) for s in args.shape.split(","))
    dev = castle.default_device()
    print(f"device {dev.name}; shape (B, H, L, d) = {shape}, float32 tensors of {np.prod(shape) * 4 / 2**20:.2f} MiB")
    host = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
    for name, fn, n in (("castle", ct.castle_attention, 6), ("causal", ct.causal_attention, 3)):
        xs = [torch.tensor(host, requires_grad=True) for _ in range(n)]

        def step():
            fn(*xs).sum().backward()

        total = best(step, args.repeat)
        copy = best(lambda: copies(dev, host, n + 1, 1 + n), args.repeat)  # in: inputs + dO; out: o + gradients
        print(f"{name}: forward + backward {total:.1f} ms; its host <-> device copies alone {copy:.2f} ms "
              f"({100 * copy / total:.1f}%)")


if __name__ == "__main__":
    main()
