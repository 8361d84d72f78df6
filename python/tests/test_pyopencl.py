"""Zero-copy interop: pyopencl arrays on the device's context are passed to the library as they
are, and results come back as pyopencl arrays.  (Skipped only when pyopencl is not installed;
.ci/run installs it.)"""

import numpy as np
import pytest

import castle
from castle import _core
from conftest import six
from reference import castle_parallel, causal, err, tolerance

cl = pytest.importorskip("pyopencl")
cla = pytest.importorskip("pyopencl.array")
FORWARD_TOL = tolerance("FORWARD_TOL")


def test_arrays_on_the_device_context_are_not_copied(rng):
    dev = castle.default_device()
    q = dev.pyopencl_queue
    x = six(rng, (2, 2, 13, 8))
    xs = [cla.to_device(q, a) for a in x]
    t = _core.upload(dev, xs[0])
    assert t.mem == xs[0].data.int_ptr  # the array's own buffer
    o, lse = castle.forward(*xs, window=3)
    assert isinstance(o, cla.Array) and isinstance(lse, cla.Array)
    ro, rlse = castle_parallel(*x, window=3)
    assert err(o.get(), ro) < FORWARD_TOL and err(lse.get(), rlse) < FORWARD_TOL
    grads = castle.backward(*xs, xs[0])
    assert all(isinstance(g, cla.Array) for g in grads)
    np.testing.assert_array_equal(np.stack([g.get() for g in grads]), np.stack(castle.backward(*x, x[0])))
    co, _ = castle.causal_forward(*xs[:3])
    assert err(co.get(), causal(*x[:3])[0]) < FORWARD_TOL


def test_a_pyopencl_queue_of_its_own(rng):
    ctx = cl.create_some_context(interactive=False)
    q = cl.CommandQueue(ctx)
    dev = castle.Device.from_pyopencl(q)
    x = six(rng, (1, 3, 10, 4))
    xs = [cla.to_device(q, a) for a in x]
    o, _ = castle.forward(*xs, device=dev)
    assert err(o.get(), castle_parallel(*x)[0]) < FORWARD_TOL
    with pytest.raises(ValueError, match="another OpenCL context"):
        castle.forward(*xs)  # the default device has its own context


def test_results_carry_the_calls_event(rng):
    """Result arrays wait for the kernels that wrote them where pyopencl waits (their .events), so a
    read on another queue of the context sees the results (it read before the kernels ran: errors 3 to 6)."""
    dev = castle.default_device()
    q2 = cl.CommandQueue(dev.pyopencl_queue.context)
    x = six(rng, (2, 4, 256, 32))
    ref = castle.forward(*x)[0]
    o, lse = castle.forward(*[cla.to_device(q2, a) for a in x])
    assert o.events and lse.events
    np.testing.assert_array_equal(o.get(queue=q2), ref)


def test_an_out_of_order_queue_is_refused():
    """The package orders its calls and reads by the queue: on an out-of-order one a read could run
    before the kernels (forward results off by 3 to 19, NaN in backward), so from_pyopencl refuses it."""
    ctx = cl.create_some_context(interactive=False)
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE)
    with pytest.raises(ValueError, match="out of order"):
        castle.Device.from_pyopencl(q)


def test_views_that_need_a_copy(rng):
    """Non-contiguous pyopencl views give the results of the same arrays from NumPy: a slice of
    tokens (an offset into its buffer) and every other column (a strided last axis), which the
    library cannot read in place and which are copied once through the host, and a head-major
    transpose, read in place.  pyopencl's own get() and copy() refuse non-contiguous arrays, which
    once made the first two fail with its AssertionError."""
    dev = castle.default_device()
    q = dev.pyopencl_queue
    wide = six(rng, (1, 2, 24, 16))
    views = {
        "tokens 8:": ([cla.to_device(q, a)[:, :, 8:] for a in wide], [a[:, :, 8:] for a in wide]),
        "columns ::2": ([cla.to_device(q, a)[..., ::2] for a in wide], [a[..., ::2] for a in wide]),
        "heads and tokens swapped": (
            [cla.to_device(q, np.ascontiguousarray(a.transpose(0, 2, 1, 3))).transpose((0, 2, 1, 3)) for a in wide],
            wide),
    }
    for name, (xs, ref) in views.items():
        assert not xs[0].flags.c_contiguous or xs[0].offset, name
        o, lse = castle.forward(*xs)
        ro, rlse = castle.forward(*ref)
        np.testing.assert_array_equal(o.get(), ro, err_msg=name)
        np.testing.assert_array_equal(lse.get(), rlse, err_msg=name)
    # decode of one token sliced out of a sequence on the device
    full = [cla.to_device(q, a) for a in wide]
    c, r = castle.Cache(1, 2, 16, capacity=24), castle.Cache(1, 2, 16, capacity=24)
    c.prefill(*[x[:, :, :20] for x in full])
    r.prefill(*[a[:, :, :20] for a in wide])
    for t in range(20, 24):
        o = c.decode(*[x[:, :, t:t + 1] for x in full])
        np.testing.assert_array_equal(o.get(), r.decode(*[a[:, :, t:t + 1] for a in wide]))
