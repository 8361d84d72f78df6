"""PyTorch layer: CASTLE and the library's causal attention as autograd functions, and
CastleAttention, an nn.Module with generation through the UQ-KV cache.

Tensors reach the OpenCL device through host memory: every call copies its inputs from host memory
into device buffers and its results back (a CUDA tensor is first moved to the host), and results
are returned on the inputs' torch device, in the dtype torch's promotion of theirs gives (each
gradient in its own input's dtype).  Inputs whose last axis is contiguous
(for example (B, H, L, d) views of (B, L, H, d) projections) are read in place, without a
transposing copy.  The forward pass keeps its device buffers (inputs, o, lse and the workspace
castle_forward fills) for the backward pass, which therefore copies only dO in and the six
gradients out and never recomputes the forward."""

import ctypes
import functools
import os
import warnings

import numpy as np
import torch
from torch import nn

from . import _core



def _caller_level():
    """warnings.warn's stacklevel for the first frame outside this package and torch: the user's
    line that called the module (through torch's Module.__call__), not torch's."""
    import sys
    skip = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(torch.__file__)))
    level, f = 1, sys._getframe(1)
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(skip):
        f, level = f.f_back, level + 1
    return level

def _host(fn, name, t):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{fn}: {name} is a {type(t).__name__}; expected a torch.Tensor")
    if t.device.type == "meta":
        raise ValueError(f"{fn}: {name} is a meta tensor (it holds no data)")
    if t.is_complex() or not (t.is_floating_point() or t.dtype in (torch.int8, torch.int16, torch.int32, torch.int64,
                                                                    torch.uint8)):
        raise ValueError(f"{fn}: {name} has dtype {t.dtype}; expected a real floating dtype (float32 on the device)")
    t = t.detach()
    if t.layout != torch.strided:  # sparse or mkldnn: its dense values
        t = t.to_dense()
    # a float32 view with the negative (or conjugate) bit set has no numpy() of its own
    t = t.cpu().resolve_conj().resolve_neg()
    return (t if t.dtype == torch.float32 else t.float()).numpy()


def _dtype(tensors):
    """The dtype of a result: torch's promotion of the inputs' floating dtypes (float16 and float64 give
    float64, as torch's own operations would), float32 where no input is floating (integers)."""
    floating = [t.dtype for t in tensors if t.is_floating_point()]
    return functools.reduce(torch.promote_types, floating) if floating else torch.float32


def _back(a, device, dtype):
    return torch.from_numpy(a).to(device=device, dtype=dtype)


def _grads(ctx, results):
    """Each gradient on its own input's device and in its dtype, straight from the library's float32
    (never through the output's dtype: a float64 input's gradient would be rounded to a float16 one)."""
    return tuple(_back(g, dev, dt) for g, (dev, dt) in zip(results, ctx.likes))


def _likes(ins):
    return [(t.device, _dtype([t])) for t in ins]


class _State:
    """What a forward pass leaves for its backward: device buffers and the descriptor."""

    def __init__(self, dev, ins, shape):
        self.dev, self.ins, self.shape, self.outs = dev, ins, shape, _core.Outputs(dev, False)

    def save(self, ctx):
        """Keeps the state for ctx's backward passes, for as long as autograd keeps ctx's saved tensors.

        The library's backward leaves the forward's state intact (castle.h, castle_forward_workspace_size),
        so a graph kept with retain_graph=True (or torch.autograd.gradcheck) may run the backward again
        on the same state.  The state rides on an empty tensor given to save_for_backward rather than on
        ctx itself: autograd drops saved tensors after a backward without retain_graph, and so the device
        buffers go then, as they would if the backward freed them, not only when the graph goes (which in
        a training loop is after the next forward: the loss keeps the graph alive until it is
        reassigned).  A later backward then raises autograd's own "backward through the graph a second
        time" error.  (torch keeps a tensor's Python attributes while autograd holds the tensor:
        PyObject preservation, pytorch#56017.)"""
        holder = torch.empty(0)
        holder.castle_state = self
        ctx.save_for_backward(holder)

    @staticmethod
    def of(ctx):
        """The state save() kept; autograd raises once a backward without retain_graph dropped it."""
        holder, = ctx.saved_tensors
        st = getattr(holder, "castle_state", None)
        if st is None:
            raise RuntimeError("castle.torch: the forward's device state did not reach the backward: saved-tensor "
                               "hooks (torch.autograd.graph.saved_tensors_hooks, save_on_cpu, "
                               "torch.utils.checkpoint with use_reentrant=False) replace the saved tensor that "
                               "carries it; they are not supported (checkpoint with use_reentrant=True is)")
        return st


def _first_order(backward):
    """A backward without a derivative of its own: refused under create_graph=True (double backward,
    torch.autograd.functional.hessian, gradient penalties), where its gradients, computed on the
    device, would enter the graph as constants and every second derivative through them would be
    silently 0 (torch's once_differentiable raises only where a gradient output requires grad)."""

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError("castle.torch: the attention's backward has no derivative of its own; "
                               "create_graph=True (double backward, hessians, gradient penalties) is not supported")
        return backward(ctx, *grads)

    return wrapper


class _CastleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, window, scale, device, *six):
        with _core._device(device)._use() as dev:
            shape, ins = _core.uploads(dev, "castle.torch.castle_attention", _core.SIX,
                                       [_host("castle.torch.castle_attention", n, t) for n, t in zip(_core.SIX, six)])
            st = _State(dev, ins, shape)
            st.desc, st.o, st.lse, st.ws = _core._forward("castle.torch.castle_attention", dev, ins, shape, window,
                                                          scale, st.outs)
            o, _ = st.outs.results()
        st.save(ctx)
        ctx.likes = _likes(six)
        return _back(o, six[0].device, _dtype(six))

    @staticmethod
    @_first_order
    def backward(ctx, do):
        st = _State.of(ctx)
        with st.dev._use() as dev:
            d = _core.upload(dev, _host("castle.torch.castle_attention", "grad", do), "castle_attention", "do")
            outs = _core.Outputs(dev, False)
            _core._backward(dev, st.desc, st.ins, st.o, st.lse, st.ws, d, outs)
            return (None, None, None) + _grads(ctx, outs.results())


class _CausalFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scale, device, q, k, v):
        names = ("q", "k", "v")
        with _core._device(device)._use() as dev:
            shape, ins = _core.uploads(dev, "castle.torch.causal_attention", names,
                                       [_host("castle.torch.causal_attention", n, t) for n, t in zip(names, (q, k, v))])
            st = _State(dev, ins, shape)
            st.desc, st.o, st.lse = _core._causal_forward("castle.torch.causal_attention", dev, ins, shape, scale,
                                                          st.outs)
            o, _ = st.outs.results()
        st.save(ctx)
        ctx.likes = _likes((q, k, v))
        return _back(o, q.device, _dtype((q, k, v)))

    @staticmethod
    @_first_order
    def backward(ctx, do):
        st = _State.of(ctx)
        with st.dev._use() as dev:
            d = _core.upload(dev, _host("castle.torch.causal_attention", "grad", do), "causal_attention", "do")
            outs = _core.Outputs(dev, False)
            _core._causal_backward(dev, st.desc, st.ins, st.o, st.lse, d, outs)
            return (None, None) + _grads(ctx, outs.results())


def castle_attention(qu, ku, vu, qc, kc, vc, window=0, scale=None, device=None):
    """CASTLE (window 0) or CASTLE-SWL (window W) attention of six (B, H, L, d) tensors -> o
    (B, H, L, d), differentiable: the backward pass is castle_backward on the forward's saved
    device state."""
    return _CastleFunction.apply(window, scale, device, qu, ku, vu, qc, kc, vc)


def causal_attention(q, k, v, scale=None, device=None):
    """The library's causal softmax attention (the baseline) of (B, H, L, d) tensors, differentiable."""
    return _CausalFunction.apply(scale, device, q, k, v)


class _Attention(nn.Module):
    """Projections of x (B, L, dim) to heads of dim_head, attention per head, the output projection,
    and generation through a cache: what CastleAttention and CausalAttention share."""

    _names = ()

    def __init__(self, dim, heads, dim_head, cache_capacity, device):
        super().__init__()
        cache_capacity = _core._int(type(self).__name__, "cache_capacity", cache_capacity, ctypes.c_size_t, lo=1)
        self.heads, self.dim_head, self.cache_capacity, self.device = heads, dim_head, cache_capacity, device
        inner = heads * dim_head
        for n in self._names:
            setattr(self, "to_" + n, nn.Linear(dim, inner, bias=False))
        self.to_out = nn.Linear(inner, dim, bias=False)

    def _project(self, x):
        B, L, _ = x.shape  # (B, H, L, d) views of (B, L, H, d) memory: read in place
        return [getattr(self, "to_" + n)(x).view(B, L, self.heads, self.dim_head).transpose(1, 2) for n in self._names]

    def forward(self, x, cache=None, return_cache=False):
        if x.dim() != 3:
            raise ValueError(f"{type(self).__name__}: x has shape {tuple(x.shape)}; expected (batch, L, dim)")
        B, L, _ = x.shape
        heads = self._project(x)
        if cache is None and not return_cache:
            o = self._attend(heads)
        else:
            if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
                warnings.warn(f"{type(self).__name__}: the cached path (cache= or return_cache=True) is for "
                              "inference: no gradient reaches the attention's projections; run it under "
                              "torch.no_grad()", stacklevel=_caller_level())
            if cache is None:
                cache = self.new_cache(B, max(L, self.cache_capacity))
            elif not isinstance(cache, self._cache_type):
                raise TypeError(f"{type(self).__name__}: cache is a {type(cache).__name__}; expected a "
                                f"castle.{self._cache_type.__name__} (new_cache() makes one)")
            host = [_host(type(self).__name__, n, t) for n, t in zip(self._names, heads)]
            step = cache.prefill if not cache.lengths.any() else cache.decode
            o = _back(step(*host), x.device, _dtype([x]))
        y = self.to_out(o.transpose(1, 2).reshape(B, L, self.heads * self.dim_head))
        return (y, cache) if return_cache else y

    def _capacity(self, capacity):
        """new_cache's capacity: the layer's cache_capacity where None, else checked as castle.Cache does."""
        if capacity is None:
            return self.cache_capacity
        return _core._int(f"{type(self).__name__}.new_cache", "capacity", capacity, ctypes.c_size_t, lo=1)

    def extra_repr(self):
        window = f", window={self.window}" if hasattr(self, "window") else ""
        return f"heads={self.heads}, dim_head={self.dim_head}{window}, cache_capacity={self.cache_capacity}"


class CastleAttention(_Attention):
    """Multi-head CASTLE attention: six projections dim -> heads x dim_head (QU, KU, VU, QC, KC, VC),
    CASTLE (window 0) or CASTLE-SWL (window W) per head, and the output projection back to dim.

    forward(x) for x of shape (B, L, dim) returns (B, L, dim).  Generation: forward(x, cache,
    return_cache=True) returns (y, cache); pass a prompt of L tokens with cache=None (a castle.Cache
    of max(L, cache_capacity) tokens per sequence is made, or use new_cache()), then one or more
    tokens at a time with the returned cache.  The outputs equal forward() of the whole sequence.
    The cached path is for inference: no gradient flows through the attention there."""

    _names = ("qu", "ku", "vu", "qc", "kc", "vc")
    _cache_type = _core.Cache

    def __init__(self, dim, heads, dim_head=64, window=0, cache_capacity=1024, device=None):
        super().__init__(dim, heads, dim_head, cache_capacity, device)
        self.window = window

    def _attend(self, six):
        return castle_attention(*six, window=self.window, device=self.device)

    def new_cache(self, batch, capacity=None):
        """An empty castle.Cache for this layer: batch sequences of at most capacity tokens."""
        return _core.Cache(batch, self.heads, self.dim_head, self._capacity(capacity), self.window,
                           device=self.device)


class CausalAttention(_Attention):
    """The baseline as a module: q, k, v projections, the library's causal attention per head and
    the output projection; generation as CastleAttention's, through a castle.CausalCache."""

    _names = ("q", "k", "v")
    _cache_type = _core.CausalCache

    def __init__(self, dim, heads, dim_head=64, cache_capacity=1024, device=None):
        super().__init__(dim, heads, dim_head, cache_capacity, device)

    def _attend(self, qkv):
        return causal_attention(*qkv, device=self.device)

    def new_cache(self, batch, capacity=None):
        """An empty castle.CausalCache for this layer."""
        return _core.CausalCache(batch, self.heads, self.dim_head, self._capacity(capacity),
                                 device=self.device)
