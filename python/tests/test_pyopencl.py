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
