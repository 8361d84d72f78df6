"""castle.torch against float64 autograd of the parallel form (reference.py), and the module."""

import weakref

import numpy as np
import pytest

import castle
from castle import _core
from conftest import six
from reference import castle_parallel_torch, causal_torch, err, tolerance

torch = pytest.importorskip("torch")  # skipped only when torch is not installed; .ci/run installs it
ct = pytest.importorskip("castle.torch")

FORWARD_TOL = tolerance("FORWARD_TOL")
BACKWARD_TOL = tolerance("BACKWARD_TOL")
CAUSAL_GRAD_TOL = tolerance("CAUSAL_GRAD_TOL")
DECODE_TOL = tolerance("DECODE_TOL")


def _grads_f64(ref, arrays, do, **kw):
    ts = [torch.tensor(np.asarray(a, np.float64), requires_grad=True) for a in arrays]
    o = ref(*ts, **kw)
    o.backward(torch.tensor(np.asarray(do, np.float64)))
    return o.detach().numpy(), [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("window", [0, 3])
def test_castle_attention_gradients(rng, window):
    shape = (2, 2, 21, 8)
    x = six(rng, shape)
    do = rng.uniform(-1, 1, shape).astype(np.float32)
    ro, rgrads = _grads_f64(castle_parallel_torch, x, do, window=window)
    ts = [torch.tensor(a, requires_grad=True) for a in x]
    o = ct.castle_attention(*ts, window=window)
    assert o.dtype == torch.float32 and o.shape == shape
    assert err(o.detach().numpy(), ro) < FORWARD_TOL
    o.backward(torch.tensor(do))
    for t, r in zip(ts, rgrads):
        assert err(t.grad.numpy(), r, floor=1e-3) < BACKWARD_TOL
    for g, r in zip(castle.backward(*x, do, window=window), rgrads):  # the NumPy function too
        assert err(g, r, floor=1e-3) < BACKWARD_TOL


def test_backward_uses_the_saved_forward(rng, monkeypatch):
    calls = []
    real = _core._forward
    monkeypatch.setattr(_core, "_forward", lambda *a: calls.append(1) or real(*a))
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in six(rng, (1, 2, 9, 4))]
    o = ct.castle_attention(*ts)
    assert o.dtype == torch.float64
    o.sum().backward()
    assert len(calls) == 1 and all(t.grad is not None and t.grad.dtype == torch.float64 for t in ts)


def test_causal_attention_gradients(rng):
    shape = (1, 3, 18, 16)
    q, k, v = six(rng, shape)[:3]
    do = rng.uniform(-1, 1, shape).astype(np.float32)
    ro, rgrads = _grads_f64(causal_torch, (q, k, v), do)
    ts = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    o = ct.causal_attention(*ts)
    assert err(o.detach().numpy(), ro) < FORWARD_TOL
    o.backward(torch.tensor(do))
    for t, r in zip(ts, rgrads):
        assert err(t.grad.numpy(), r, floor=0.1) < CAUSAL_GRAD_TOL
    for g, r in zip(castle.causal_backward(q, k, v, do), rgrads):
        assert err(g, r, floor=0.1) < CAUSAL_GRAD_TOL


def _module_reference(m, x):
    """CastleAttention in float64 through the parallel form, with m's weights."""
    B, L, _ = x.shape
    six = [(x @ p.weight.double().T).view(B, L, m.heads, m.dim_head).transpose(1, 2)
           for p in (m.to_qu, m.to_ku, m.to_vu, m.to_qc, m.to_kc, m.to_vc)]
    o = castle_parallel_torch(*six, window=m.window)
    return o.transpose(1, 2).reshape(B, L, -1) @ m.to_out.weight.double().T


@pytest.mark.parametrize("window", [0, 4])
def test_module_output_gradients_and_generation(rng, window):
    torch.manual_seed(0)
    m = ct.CastleAttention(dim=12, heads=2, dim_head=8, window=window, cache_capacity=16)
    x = torch.tensor(rng.uniform(-1, 1, (2, 15, 12)), dtype=torch.float32)
    y = m(x)
    ref_m = ct.CastleAttention(dim=12, heads=2, dim_head=8, window=window).double()
    ref_m.load_state_dict(m.state_dict())
    ry = _module_reference(ref_m, x.double())
    assert err(y.detach().numpy(), ry.detach().numpy()) < FORWARD_TOL
    w = torch.tensor(rng.uniform(-1, 1, y.shape), dtype=torch.float32)
    (y * w).sum().backward()
    (ry * w.double()).sum().backward()
    for (name, p), (_, rp) in zip(m.named_parameters(), ref_m.named_parameters()):
        assert err(p.grad.numpy(), rp.grad.numpy(), floor=1e-3) < BACKWARD_TOL, name
    with torch.no_grad():  # a prompt, one token, then three per call
        y0, cache = m(x[:, :8], return_cache=True)
        y1, cache = m(x[:, 8:9], cache=cache, return_cache=True)
        y2, cache = m(x[:, 9:12], cache=cache, return_cache=True)
        y3, cache = m(x[:, 12:], cache=cache, return_cache=True)
    assert list(cache.lengths) == [15, 15]
    gen = torch.cat([y0, y1, y2, y3], dim=1)
    assert np.max(np.abs(gen.numpy() - y.detach().numpy())) < DECODE_TOL
    with pytest.raises(castle.CastleError) as e, torch.no_grad():
        m(x[:, :2], cache=cache, return_cache=True)  # 17 > capacity 16
    assert e.value.name == "CASTLE_ERR_CACHE_FULL"


def test_causal_module(rng):
    torch.manual_seed(1)
    m = ct.CausalAttention(dim=8, heads=2, dim_head=4)
    x = torch.tensor(rng.uniform(-1, 1, (1, 10, 8)), dtype=torch.float32, requires_grad=True)
    y = m(x)
    q, k, v = ((x.double() @ p.weight.double().T).view(1, 10, 2, 4).transpose(1, 2) for p in (m.to_q, m.to_k, m.to_v))
    ry = causal_torch(q, k, v).transpose(1, 2).reshape(1, 10, 8) @ m.to_out.weight.double().T
    assert err(y.detach().numpy(), ry.detach().numpy()) < FORWARD_TOL
    w = torch.tensor(rng.uniform(-1, 1, y.shape))
    (y * w).sum().backward()
    x64 = x.detach().double().requires_grad_()
    q, k, v = ((x64 @ p.weight.double().T).view(1, 10, 2, 4).transpose(1, 2) for p in (m.to_q, m.to_k, m.to_v))
    (causal_torch(q, k, v).transpose(1, 2).reshape(1, 10, 8) @ m.to_out.weight.double().T * w).sum().backward()
    assert err(x.grad.numpy(), x64.grad.numpy(), floor=0.1) < CAUSAL_GRAD_TOL
    with torch.no_grad():
        y0, cache = m(x[:, :4], return_cache=True)
        y1, cache = m(x[:, 4:5], cache=cache, return_cache=True)
        y2, cache = m(x[:, 5:], cache=cache, return_cache=True)
    assert list(cache.lengths) == [10] and cache.nbytes > 0
    assert np.max(np.abs(torch.cat([y0, y1, y2], 1).numpy() - y.detach().numpy())) < DECODE_TOL


def test_torch_errors(rng):
    x = [torch.tensor(a) for a in six(rng, (1, 1, 4, 4))]
    with pytest.raises(ValueError, match="kc"):
        ct.castle_attention(*x[:4], x[4][0], x[5])
    with pytest.raises(ValueError, match="qu"):
        ct.castle_attention(x[0].to(torch.complex64), *x[1:])
    with pytest.raises(ValueError, match="v"):
        ct.causal_attention(x[0], x[1], np.zeros((1, 1, 4, 4)))
    with pytest.raises(ValueError, match="batch, L, dim"):
        ct.CastleAttention(4, 1, 4)(torch.zeros(4, 4))


def test_mixed_dtypes(rng):
    """The output takes torch's promotion of the inputs' dtypes and each gradient its own input's
    dtype, straight from float32: a float64 input's gradient was rounded through qu's float16."""
    x = six(rng, (1, 2, 9, 8))
    ts = [torch.tensor(a, dtype=torch.float16 if i == 0 else torch.float64, requires_grad=True)
          for i, a in enumerate(x)]
    ref = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in x]
    ref[0] = torch.tensor(x[0], dtype=torch.float16).double().requires_grad_()  # the same float16 values
    o = ct.castle_attention(*ts)
    assert o.dtype == torch.float64
    o.sum().backward()
    o_ref = ct.castle_attention(*ref)
    o_ref.sum().backward()
    assert [t.grad.dtype for t in ts] == [torch.float16] + [torch.float64] * 5
    for t, r in zip(ts[1:], ref[1:]):  # float32 results in float64: bitwise those of an all-float64 call
        assert torch.equal(t.grad, r.grad)
    q = [torch.tensor(a, dtype=dt, requires_grad=True) for a, dt in zip(x[:3], (torch.float64, torch.bfloat16,
                                                                                  torch.float32))]
    o = ct.causal_attention(*q)
    assert o.dtype == torch.float64
    o.sum().backward()
    assert [t.grad.dtype for t in q] == [torch.float64, torch.bfloat16, torch.float32]


def test_tensor_kinds(rng):
    """A float32 view with the negative bit set (the imaginary part of a conjugate), a sparse tensor and
    an mkldnn one are read as their values (they raised torch's RuntimeError or TypeError)."""
    x = [torch.tensor(a) for a in six(rng, (1, 1, 5, 4))]
    want = ct.castle_attention(*x)
    neg = (torch.complex(torch.zeros_like(x[0]), -x[0])).conj().imag  # equals x[0], with the negative bit
    assert neg.is_neg() and torch.equal(neg, x[0])
    assert torch.equal(ct.castle_attention(neg, *x[1:]), want)
    assert torch.equal(ct.castle_attention(x[0].to_sparse(), *x[1:]), want)
    assert torch.equal(ct.castle_attention(x[0].to_mkldnn(), *x[1:]), want)


def test_a_cache_of_the_other_kind_is_named(rng):
    x = torch.tensor(rng.uniform(-1, 1, (1, 3, 8)).astype(np.float32))
    for m, other in ((ct.CastleAttention(8, 2, 4), ct.CausalAttention(8, 2, 4)),
                     (ct.CausalAttention(8, 2, 4), ct.CastleAttention(8, 2, 4))):
        with torch.no_grad(), pytest.raises(TypeError, match=f"expected a castle.{type(m.new_cache(1)).__name__}"):
            m(x, cache=other.new_cache(1), return_cache=True)


@pytest.mark.parametrize("fn, n", [("castle_attention", 6), ("causal_attention", 3)])
def test_a_retained_graph_runs_the_backward_again(rng, monkeypatch, fn, n):
    made = []  # the forwards' states (their device buffers), weakly
    init = ct._State.__init__
    monkeypatch.setattr(ct._State, "__init__", lambda st, *a: made.append(weakref.ref(st)) or init(st, *a))
    ts = [torch.tensor(a, requires_grad=True) for a in six(rng, (1, 2, 6, 4))[:n]]
    o = getattr(ct, fn)(*ts)
    w = torch.tensor(rng.uniform(-1, 1, o.shape), dtype=torch.float32)
    state = made[-1]
    first = torch.autograd.grad(o, ts, w, retain_graph=True)
    assert state() is not None
    second = torch.autograd.grad(o, ts, w)  # the same state again: the same gradients, bitwise
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert state() is None  # freed by the backward without retain_graph, while o (and its graph) lives on
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(o, ts, w)
    o = getattr(ct, fn)(*ts)
    state = made[-1]
    del o  # the graph goes without a backward: the state with it
    assert state() is None


def test_gradcheck(rng):
    x = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in six(rng, (1, 1, 5, 3))]
    tol = dict(eps=1e-3, atol=2e-3, rtol=2e-2)  # float32 on the device: finite differences need a large eps
    assert torch.autograd.gradcheck(lambda *a: ct.castle_attention(*a), x, **tol)
    assert torch.autograd.gradcheck(lambda *a: ct.castle_attention(*a, window=2), x, **tol)
    assert torch.autograd.gradcheck(lambda *a: ct.causal_attention(*a), x[:3], **tol)


def test_torch_zero_extents_and_closed_devices(rng):
    z = [torch.zeros(1, 2, 0, 4) for _ in range(6)]
    with pytest.raises(ValueError, match="qu has shape .* every extent must be at least 1"):
        ct.castle_attention(*z)
    with pytest.raises(ValueError, match="q has shape .* every extent must be at least 1"):
        ct.causal_attention(*z[:3])
    dev = castle.Device()
    ts = [torch.tensor(a, requires_grad=True) for a in six(rng, (1, 1, 4, 4))]
    o = ct.castle_attention(*ts, device=dev)
    dev.close()
    with pytest.raises(ValueError, match="is closed"):
        o.sum().backward()
    with pytest.raises(ValueError, match="is closed"):
        ct.causal_attention(*ts[:3], device=dev)


def test_module_cache_holds_a_longer_prompt(rng):
    """CastleAttention's docstring: the cache made for a prompt of L tokens holds max(L, cache_capacity)."""
    m = ct.CastleAttention(dim=8, heads=1, dim_head=4, cache_capacity=4)
    x = torch.tensor(rng.uniform(-1, 1, (1, 6, 8)), dtype=torch.float32)
    with torch.no_grad():
        _, cache = m(x, return_cache=True)
        assert cache.capacity == 6 and list(cache.lengths) == [6]
        _, cache = m(x[:, :2], return_cache=True)
        assert cache.capacity == 4


def test_double_backward_is_refused(rng):
    """Under create_graph=True the device-computed gradients would enter the graph as constants, so
    every second derivative through them would be 0 (a gradient penalty's gradient, a hessian): the
    backward refuses instead (it returned constants before)."""
    x = [torch.tensor(a, requires_grad=True) for a in six(rng, (1, 1, 6, 4))]
    for f, args in ((ct.castle_attention, x), (ct.causal_attention, x[:3])):
        o = f(*args)
        with pytest.raises(RuntimeError, match="create_graph=True"):
            torch.autograd.grad(o.square().sum(), args, create_graph=True)
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.functional.hessian(lambda q: ct.causal_attention(q, x[1], x[2]).sum(), x[0].detach())


def test_saved_tensor_hooks_are_named(rng):
    """save_on_cpu (and any saved-tensor hooks) replace the saved tensor the device state rides on:
    a clear error that names them, where the message blamed torch's version before."""
    x = [torch.tensor(a, requires_grad=True) for a in six(rng, (1, 1, 6, 4))]
    with torch.autograd.graph.save_on_cpu():
        o = ct.castle_attention(*x)
    with pytest.raises(RuntimeError, match="saved-tensor hooks"):
        o.sum().backward()


def test_modules_copy_pickle_and_check_their_arguments(rng):
    import copy
    import pickle
    dev = castle.Device()
    m = ct.CastleAttention(dim=8, heads=2, dim_head=4, window=3, cache_capacity=12, device=dev)
    assert "window=3" in repr(m) and "cache_capacity=12" in repr(m)
    x = torch.tensor(rng.uniform(-1, 1, (1, 5, 8)), dtype=torch.float32)
    m2 = copy.deepcopy(m)  # shares the Device (it said the copy's device was closed before)
    assert m2.device is dev and not dev.closed
    assert torch.equal(m2(x), m(x))
    d2 = pickle.loads(pickle.dumps(dev))  # a Device on the same spec
    assert d2 is not dev and d2.spec == dev.spec and not d2.closed
    cache = m.new_cache(1)
    for copier in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="cannot be copied or pickled"):
            copier(cache)
    for bad in (0, -5, 2.5):
        with pytest.raises(ValueError, match="cache_capacity"):
            ct.CastleAttention(dim=8, heads=2, dim_head=4, cache_capacity=bad)
        with pytest.raises(ValueError, match="capacity"):
            m.new_cache(1, bad)  # it was replaced by the layer's default before
    with pytest.raises(ValueError, match="meta tensor"):
        ct.castle_attention(*[torch.empty(1, 1, 4, 4, device="meta")] * 6)
    with pytest.warns(UserWarning, match="no gradient reaches") as w:  # grad enabled on the cached path
        m(x, return_cache=True)
    assert w[0].filename == __file__  # the caller's line, not torch's Module.__call__
    d2.close()
    dev.close()
