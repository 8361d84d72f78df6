"""float64 NumPy references, independent of the library: CASTLE by its recurrent definition and by
its parallel form (docs/algorithm.md sections 1 and 2), causal softmax attention, and the tolerances of
conformance/tolerance.h (read from that file, so they are stated once)."""

import os
import re

import numpy as np

_TOL_H = os.path.join(os.path.dirname(__file__), "..", "..", "conformance", "tolerance.h")


def tolerance(name):
    with open(_TOL_H) as f:
        m = re.search(r"#define\s+%s\s+([0-9.eE+-]+)" % name, f.read())
    assert m, f"{name} not in {_TOL_H}"
    return float(m.group(1))


def err(got, ref, floor=1.0):
    """max |got - ref| / max(floor, max |ref|), the measure of conformance/harness.c."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(got - ref)) / max(floor, float(np.max(np.abs(ref)))))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _silu(x):
    return x * _sigmoid(x)


def _gate(qu, ku, sc, window):
    L = qu.shape[0]
    s, j = np.arange(L)[:, None], np.arange(L)[None, :]
    mask = (j > s) & ((j <= s + window) if window else True)
    return np.where(mask, _sigmoid(sc * qu @ ku.T), 0.0)


def _finish(a):
    m = a.max(axis=-1, keepdims=True)
    e = np.exp(a - m)
    z = e.sum(axis=-1, keepdims=True)
    return e / z, (m + np.log(z))[..., 0]


def _heads(fn, arrays, *args):
    """Applies fn(one head's (L, d) float64 matrices..., *args) -> (o, lse) over (B, H)."""
    arrays = [np.asarray(x, np.float64) for x in arrays]
    B, H, L, d = arrays[0].shape
    o, lse = np.zeros((B, H, L, d)), np.zeros((B, H, L))
    for b in range(B):
        for h in range(H):
            o[b, h], lse[b, h] = fn(*(x[b, h] for x in arrays), *args)
    return o, lse


def _recurrent_head(qu, ku, vu, qc, kc, vc, window, scale):
    L, d = qu.shape
    sc = scale if scale else 1.0 / np.sqrt(d)
    G = _gate(qu, ku, sc, window)
    o, lse = np.zeros((L, d)), np.zeros(L)
    for t in range(L):
        u = G[: t + 1, : t + 1] @ vu[: t + 1]  # u^t_s = sum_{s < j <= t} G[s, j] vU_j, s = 0..t
        a = sc * kc[: t + 1] @ qc[t] - _silu(sc * u @ qc[t])
        p, lse[t] = _finish(a[None, :])
        o[t] = p[0] @ vc[: t + 1]
    return o, lse


def _parallel_head(qu, ku, vu, qc, kc, vc, window, scale):
    L, d = qu.shape
    sc = scale if scale else 1.0 / np.sqrt(d)
    causal = np.tril(np.ones((L, L), bool))
    X = np.where(causal, sc * qc @ vu.T, 0.0)
    SU = X @ _gate(qu, ku, sc, window).T
    A = np.where(causal, sc * qc @ kc.T - _silu(SU), -np.inf)
    p, lse = _finish(A)
    return p @ vc, lse


def castle_recurrent(qu, ku, vu, qc, kc, vc, window=0, scale=None):
    return _heads(_recurrent_head, (qu, ku, vu, qc, kc, vc), window, scale)


def castle_parallel(qu, ku, vu, qc, kc, vc, window=0, scale=None):
    return _heads(_parallel_head, (qu, ku, vu, qc, kc, vc), window, scale)


def _causal_head(q, k, v, scale):
    L, d = q.shape
    sc = scale if scale else 1.0 / np.sqrt(d)
    A = np.where(np.tril(np.ones((L, L), bool)), sc * q @ k.T, -np.inf)
    p, lse = _finish(A)
    return p @ v, lse


def causal(q, k, v, scale=None):
    return _heads(_causal_head, (q, k, v), scale)


def castle_parallel_torch(qu, ku, vu, qc, kc, vc, window=0, scale=None):
    """The parallel form on (B, H, L, d) torch tensors, for float64 autograd references."""
    import torch
    L, d = qu.shape[-2:]
    sc = scale if scale else 1.0 / d ** 0.5
    s, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    gmask = (j > s) & ((j <= s + window) if window else True)
    causal_m = j <= s
    G = torch.where(gmask, torch.sigmoid(sc * qu @ ku.transpose(-1, -2)), torch.zeros((), dtype=qu.dtype))
    X = torch.where(causal_m, sc * qc @ vu.transpose(-1, -2), torch.zeros((), dtype=qu.dtype))
    SU = X @ G.transpose(-1, -2)
    A = sc * qc @ kc.transpose(-1, -2) - torch.nn.functional.silu(SU)
    A = A.masked_fill(~causal_m, float("-inf"))
    return torch.softmax(A, dim=-1) @ vc


def causal_torch(q, k, v, scale=None):
    import torch
    L, d = q.shape[-2:]
    sc = scale if scale else 1.0 / d ** 0.5
    A = (sc * q @ k.transpose(-1, -2)).masked_fill(~torch.tril(torch.ones(L, L, dtype=torch.bool)), float("-inf"))
    return torch.softmax(A, dim=-1) @ v
