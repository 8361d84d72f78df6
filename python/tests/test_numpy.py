"""castle's NumPy functions against the float64 references of reference.py (recurrent definition
and parallel form), and its errors."""

import ctypes
import gc

import numpy as np
import pytest

import castle
from castle import _core, _lib
from conftest import six
from reference import castle_parallel, castle_recurrent, causal, err, tolerance

FORWARD_TOL = tolerance("FORWARD_TOL")
DECODE_TOL = tolerance("DECODE_TOL")
CAUSAL_TOL = tolerance("CAUSAL_TOL")

SHAPES = [(1, 1, 1, 4), (2, 3, 17, 8), (1, 2, 70, 32)]


def test_descriptor_layout_matches_the_library():
    d = _lib.AttentionDesc()
    assert _lib.desc_init(d, 2, 3, 5, 7) == 0  # the library knows this binding's struct size
    assert d.struct_size == ctypes.sizeof(_lib.AttentionDesc)
    assert (d.batch, d.heads, d.seq_len, d.head_dim, d.window, d.scale) == (2, 3, 5, 7, 0, 0.0)
    assert [d.layout[t].row_stride for t in range(_lib.TENSOR_COUNT)] == [0] * _lib.TENSOR_COUNT
    small = _lib.lib.castle_attention_desc_init_sized(ctypes.byref(d), ctypes.sizeof(_lib.AttentionDesc) - 8, 1, 1,
                                                      1, 1)
    assert _lib.lib.castle_status_string(small) == b"CASTLE_ERR_DESC_VERSION"


def test_library_is_named():
    assert castle.library_path.endswith(".so") or ".so." in castle.library_path
    assert castle.library_origin
    assert castle.library_version.count(".") == 2


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("window", [0, 5])
def test_forward_against_recurrent_and_parallel(rng, shape, window):
    x = six(rng, shape)
    o, lse = castle.forward(*x, window=window)
    assert o.shape == shape and lse.shape == shape[:3] and o.dtype == np.float32
    for ref in (castle_recurrent, castle_parallel):
        ro, rlse = ref(*x, window=window)
        assert err(o, ro) < FORWARD_TOL
        assert err(lse, rlse) < FORWARD_TOL


def test_references_agree_and_the_window_matters(rng):
    x = six(rng, (1, 2, 23, 8))
    assert err(castle_recurrent(*x)[0], castle_parallel(*x)[0]) < 1e-12
    assert err(castle_parallel(*x, window=3)[0], castle_parallel(*x)[0]) > 1e-3


def test_scale_dtypes_and_strided_inputs(rng):
    B, H, L, d = 2, 3, 19, 16
    x = six(rng, (B, L, H, d))
    views = [a.transpose(0, 2, 1, 3) for a in x]  # (B, H, L, d) views of (B, L, H, d) memory
    ref = castle_parallel(*views, scale=0.3)[0]
    assert err(castle.forward(*views, scale=0.3)[0], ref) < FORWARD_TOL
    f64 = [v.astype(np.float64)[:, :, ::1] for v in views]
    assert err(castle.forward(*f64, scale=0.3)[0], ref) < FORWARD_TOL
    reversed_rows = [np.ascontiguousarray(v)[:, :, ::-1] for v in views]  # negative strides: copied
    assert err(castle.forward(*reversed_rows, scale=0.3)[0], castle_parallel(*reversed_rows, scale=0.3)[0]) \
        < FORWARD_TOL
    lists = [v.tolist() for v in views]  # anything np.asarray takes
    assert err(castle.forward(*lists, scale=0.3)[0], ref) < FORWARD_TOL


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_causal_forward(rng, shape):
    q, k, v = six(rng, shape)[:3]
    o, lse = castle.causal_forward(q, k, v)
    ro, rlse = causal(q, k, v)
    assert err(o, ro) < CAUSAL_TOL and err(lse, rlse) < CAUSAL_TOL


@pytest.mark.parametrize("window", [0, 4])
def test_cache_decode_equals_forward(rng, window):
    B, H, L, d, P = 2, 2, 30, 16, 11
    x = six(rng, (B, H, L, d))
    ref = castle_recurrent(*x, window=window)[0]
    full = castle.forward(*x, window=window)[0]
    cache = castle.Cache(B, H, d, capacity=L, window=window)
    assert cache.nbytes > 0 and list(cache.lengths) == [0, 0]
    pieces = [cache.prefill(*(a[:, :, :P] for a in x))]
    assert list(cache.lengths) == [P, P]
    for t in range(P, P + 5):  # one token per call
        pieces.append(cache.decode(*(a[:, :, t:t + 1] for a in x)))
    for t0, t1 in ((P + 5, P + 12), (P + 12, L)):  # several tokens per call
        pieces.append(cache.decode(*(a[:, :, t0:t1] for a in x)))
    o = np.concatenate(pieces, axis=2)
    assert list(cache.lengths) == [L, L]
    assert err(o, ref) < DECODE_TOL
    assert np.max(np.abs(o - full)) < DECODE_TOL
    cache.reset()
    assert list(cache.lengths) == [0, 0]
    o2 = np.concatenate([cache.decode(*(a[:, :, t:t + 1] for a in x)) for t in range(L)], axis=2)  # from empty
    assert err(o2, ref) < DECODE_TOL


def test_causal_cache_decode_equals_forward(rng):
    B, H, L, d = 1, 2, 20, 8
    q, k, v = six(rng, (B, H, L, d))[:3]
    cache = castle.CausalCache(B, H, d, capacity=L)
    o = np.concatenate([cache.prefill(q[:, :, :6], k[:, :, :6], v[:, :, :6]),
                        cache.decode(q[:, :, 6:7], k[:, :, 6:7], v[:, :, 6:7]),
                        cache.decode(q[:, :, 7:], k[:, :, 7:], v[:, :, 7:])], axis=2)
    assert err(o, causal(q, k, v)[0]) < CAUSAL_TOL and list(cache.lengths) == [L] and cache.nbytes > 0
    with pytest.raises(castle.CastleError) as e:
        cache.decode(q[:, :, :1], k[:, :, :1], v[:, :, :1])
    assert e.value.name == "CASTLE_ERR_CACHE_FULL"
    cache.reset()
    assert list(cache.lengths) == [0]


def test_cache_prefill_lengths(rng):
    B, H, P, d = 2, 1, 12, 8
    x = six(rng, (B, H, P, d))
    cache = castle.Cache(B, H, d, capacity=20)
    o = cache.prefill(*x, lengths=[12, 7])
    assert list(cache.lengths) == [12, 7]
    assert err(o[0], castle_parallel(*(a[:1] for a in x))[0][0]) < DECODE_TOL
    assert err(o[1, :, :7], castle_parallel(*(a[1:, :, :7] for a in x))[0][0]) < DECODE_TOL


def test_cache_full_and_not_empty(rng):
    x = six(rng, (1, 1, 4, 8))
    cache = castle.Cache(1, 1, 8, capacity=6)
    cache.prefill(*x)
    with pytest.raises(castle.CastleError) as e:
        cache.decode(*x)  # 4 + 4 > 6
    assert e.value.name == "CASTLE_ERR_CACHE_FULL" and e.value.status == -3023 and e.value.message
    # the call, the status and the library's words, each once
    assert str(e.value).count("castle_decode") == 1 and str(e.value).count("CASTLE_ERR_CACHE_FULL") == 1, str(e.value)
    assert list(cache.lengths) == [4]  # unchanged
    with pytest.raises(castle.CastleError) as e:
        cache.prefill(*x)
    assert e.value.name == "CASTLE_ERR_CACHE_NOT_EMPTY"
    with pytest.raises(ValueError, match="qu"):
        cache.decode(*six(rng, (1, 2, 1, 8)))  # heads differ from the cache's
    with pytest.raises(ValueError, match="lengths"):
        castle.Cache(1, 1, 8, capacity=6).prefill(*x, lengths=[1, 2])
    with pytest.raises(ValueError, match="capacity"):
        castle.Cache(1, 1, 8, capacity=0)


def test_bad_shapes_and_dtypes(rng):
    x = six(rng, (1, 2, 5, 8))
    with pytest.raises(ValueError, match="ku"):
        castle.forward(x[0], x[1][0], *x[2:])  # 3-D
    with pytest.raises(ValueError, match="vc"):
        castle.forward(*x[:5], x[5][:, :, :4])  # another L
    with pytest.raises(ValueError, match="qc"):
        castle.forward(*x[:3], x[3].astype(np.complex64), *x[4:])
    with pytest.raises(ValueError, match="do"):
        castle.backward(*x, np.zeros((1, 2, 5, 7), np.float32))
    with pytest.raises(ValueError, match="k"):
        castle.causal_forward(x[0], np.array(["a"] * 80).reshape(1, 2, 5, 8), x[2])
    with pytest.raises(ValueError, match="head dim"):
        castle.forward(*(np.zeros((1, 1, 2, 300), np.float32) for _ in range(6)))
    with pytest.raises(ValueError, match="window"):
        castle.forward(*x, window=-1)
    with pytest.raises(ValueError, match="scale"):
        castle.forward(*x, scale=float("nan"))
    with pytest.raises(castle.CastleError) as e:  # the library's own check (above CASTLE_MAX_SCALE)
        castle.forward(*x, scale=1e6)
    assert e.value.name == "CASTLE_ERR_BAD_SCALE" and "scale" in e.value.message
    assert str(e.value).startswith("castle.forward: ")  # the call made, not the size query inside it


def test_devices_and_device_errors():
    devs = castle.devices()
    assert devs and devs[0].spec == "0:0" and devs[0].index == 0 and devs[0].name
    dev = castle.Device(devs[0].spec)
    assert dev.name == devs[0].name and dev.tuning["block"] >= 8 and dev.tuning["decode"] in (1, 2) \
        and dev.tuning["stage"] in (1, 2)
    assert castle.Device("0").name == devs[0].name
    with pytest.raises(castle.CastleError) as e:
        castle.Device("banana")
    assert e.value.name == "CASTLE_ERR_BAD_DEVICE_SPEC" and "banana" in str(e.value)
    with pytest.raises(castle.CastleError) as e:
        castle.Device(f"{len(devs) + 5}")
    assert e.value.name == "CASTLE_ERR_NO_DEVICE"


def test_loop_limit(monkeypatch):
    """Device.loop_limit is the device's loop limit (CASTLE_LOOP_LIMIT here); a causal backward whose
    loops pass it runs in ranges and gives the gradients of a device without one; below one block it
    raises."""
    monkeypatch.setenv("CASTLE_LOOP_LIMIT", "0")
    free = castle.Device("0:0")
    assert free.loop_limit == 0
    monkeypatch.setenv("CASTLE_LOOP_LIMIT", "6000")
    dev = castle.Device("0:0")
    assert dev.loop_limit == 6000
    block = dev.tuning["block"]
    rng = np.random.default_rng(3)
    q, k, v, do = (rng.uniform(-1, 1, (1, 1, 40 * block - 3, 64)).astype(np.float32) for _ in range(4))
    for a, b in zip(castle.causal_backward(q, k, v, do, device=dev), castle.causal_backward(q, k, v, do, device=free)):
        assert err(a, b, 1e-3) < tolerance("CAUSAL_GRAD_TOL")
    monkeypatch.setenv("CASTLE_LOOP_LIMIT", "900")
    with pytest.raises(castle.CastleError) as e:
        castle.causal_backward(q, k, v, do, device=castle.Device("0:0"))
    assert e.value.name == "CASTLE_ERR_DEVICE_UNSUPPORTED" and "castle_causal_backward_kv" in str(e.value)


def test_devices_are_castle_infos():
    """devices() lists what castle-info lists ("Device P:D (#N): name"), in its order."""
    import os
    import re
    import shutil
    import subprocess
    info = os.path.join(os.path.dirname(castle.library_path), "tools", "castle-info")
    if not os.path.exists(info):
        info = shutil.which("castle-info")
    if info is None:
        pytest.skip("no castle-info beside the library or on PATH")
    out = subprocess.run([info], capture_output=True, text=True, timeout=600).stdout
    listed = re.findall(r"Device (\d+:\d+) \(#(\d+)\): (.*)", out)
    assert listed == [(d.spec, str(d.index), d.name) for d in castle.devices()]


def test_explicit_device(rng):
    x = six(rng, (1, 1, 9, 4))
    dev = castle.Device()
    assert err(castle.forward(*x, device=dev)[0], castle_parallel(*x)[0]) < FORWARD_TOL


def test_no_library_gives_an_actionable_message(tmp_path):
    import os
    import subprocess
    import sys
    env = dict(os.environ, CASTLE_LIBRARY=str(tmp_path / "libcastle.so"),
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(castle.__file__))))
    r = subprocess.run([sys.executable, "-c", "import castle"], env=env, capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode != 0
    assert "libcastle not found" in r.stderr and "CASTLE_LIBRARY" in r.stderr and str(tmp_path) in r.stderr


def test_a_closed_device_raises_and_closes_its_caches(rng):
    x = six(rng, (1, 1, 4, 8))
    dev = castle.Device()
    _, kept = _core.uploads(dev, "test", _core.SIX, x)  # device buffers made before the close
    cache, causal_cache = castle.Cache(1, 1, 8, capacity=8, device=dev), castle.CausalCache(1, 1, 8, 8, device=dev)
    cache.prefill(*x)
    assert not dev.closed
    dev.close()
    dev.close()  # twice: nothing more
    assert dev.closed
    for use in (lambda: castle.forward(*x, device=dev), lambda: castle.backward(*x, x[0], device=dev),
                lambda: castle.causal_forward(*x[:3], device=dev), lambda: castle.Cache(1, 1, 8, 8, device=dev),
                dev.finish, lambda: dev.tuning, lambda: dev.queue, lambda: dev._handle):
        with pytest.raises(ValueError, match=r"castle\.Device\(.*\) is closed"):
            use()
    for use in (lambda: cache.decode(*x), lambda: cache.lengths, cache.reset, lambda: cache.nbytes,
                lambda: causal_cache.prefill(*x[:3]), lambda: causal_cache.lengths):
        with pytest.raises(ValueError, match="Cache is closed"):
            use()
    del kept
    cache = causal_cache = None
    gc.collect()  # the buffers and caches go after their context: no crash


def test_default_device_after_it_was_closed(rng, monkeypatch):
    monkeypatch.setattr(_core, "_default", castle.Device())  # the shared default device stays as it is
    x = six(rng, (1, 1, 5, 4))
    old = castle.default_device()
    old.close()
    new = castle.default_device()
    assert new is not old and not new.closed and castle.default_device() is new
    assert err(castle.forward(*x)[0], castle_parallel(*x)[0]) < FORWARD_TOL


def test_integers_past_their_c_types_are_refused(rng):
    long_max = 2**(8 * ctypes.sizeof(ctypes.c_long) - 1) - 1  # castle_attention_desc's long window
    x = six(rng, (1, 1, 4, 8))
    for window in (2**64 + 1, long_max + 1, 10**30):  # ctypes would wrap these (2**64 + 1 into window 1)
        with pytest.raises(ValueError, match=rf"castle\.forward: window={window}; expected an integer in "
                                             rf"0\.\.{long_max}"):
            castle.forward(*x, window=window)
    with pytest.raises(ValueError, match="window"):
        castle.Cache(1, 1, 8, capacity=4, window=2**64 + 2)
    with pytest.raises(ValueError, match=r"castle\.Cache: capacity=18446744073709551620; expected an integer in 1\.\."):
        castle.Cache(1, 1, 8, capacity=2**64 + 4)  # the library would hold 4 tokens
    for kw in (dict(batch=2**64 + 1), dict(heads=2**64 + 1), dict(head_dim=2**64 + 8)):
        with pytest.raises(ValueError, match=list(kw)[0]):
            castle.Cache(**{"batch": 1, "heads": 1, "head_dim": 8, "capacity": 4, **kw})
    with pytest.raises(ValueError, match=r"castle\.Cache\.prefill: lengths\[1\]=18446744073709551618"):
        castle.Cache(2, 1, 8, capacity=8).prefill(*six(rng, (2, 1, 4, 8)), lengths=[4, 2**64 + 2])
    cache = castle.Cache(np.int64(1), 1, 8.0, capacity=np.uint64(6), window=2.0)  # integers in range still go
    assert (cache.batch, cache.head_dim, cache.capacity) == (1, 8, 6) and type(cache.capacity) is int
    assert err(castle.forward(*x, window=long_max)[0], castle_parallel(*x)[0]) < FORWARD_TOL  # no window at all
    assert _lib.c_range(ctypes.c_long) == (-long_max - 1, long_max)
    assert _lib.c_range(ctypes.c_size_t) == (0, 2**(8 * ctypes.sizeof(ctypes.c_size_t)) - 1)


def test_zero_extents_raise_a_value_error_naming_the_argument(rng):
    for shape in ((1, 2, 0, 8), (0, 2, 4, 8), (1, 0, 4, 8)):
        x = [np.zeros(shape, np.float32)] * 6
        for call, names in ((castle.forward, x), (castle.backward, x + x[:1]), (castle.causal_forward, x[:3]),
                            (castle.causal_backward, x[:4])):
            with pytest.raises(ValueError, match=r"(qu|q) has shape .* every extent must be at least 1"):
                call(*names)
    with pytest.raises(ValueError, match="head dim 0"):
        castle.forward(*[np.zeros((1, 2, 4, 0), np.float32)] * 6)
    none = [np.zeros((1, 1, 0, 8), np.float32)] * 6  # n = 0 new tokens
    for cache, k in ((castle.Cache(1, 1, 8, 4), 6), (castle.CausalCache(1, 1, 8, 4), 3)):
        for step in (cache.prefill, cache.decode):
            with pytest.raises(ValueError, match=r"Cache\.(prefill|decode): q.? has shape \(1, 1, 0, 8\)"):
                step(*none[:k])


def test_scales_float32_cannot_hold_are_refused(rng):
    x = six(rng, (1, 1, 4, 8))
    for scale in (1e-50, 1e-46, 1e39, 10**400, 0, -1.0, float("inf"), "x", "0.5", [0.5]):
        with pytest.raises(ValueError, match=r"castle\.forward: scale=.*expected a real number > 0"):
            castle.forward(*x, scale=scale)  # 1e-50 rounds to float32 0, which the library reads as 1/sqrt(d)
    with pytest.raises(ValueError, match="scale"):
        castle.Cache(1, 1, 8, capacity=4, scale=1e-50)
    with pytest.raises(ValueError, match="scale"):
        castle.causal_forward(*x[:3], scale=1e-50)
    assert err(castle.forward(*x, scale=np.float32(1e-30))[0], castle_parallel(*x, scale=1e-30)[0]) < FORWARD_TOL


def test_argument_errors_name_the_argument(rng):
    x = six(rng, (1, 1, 4, 8))
    for kw in (dict(window=None), dict(window=float("nan")), dict(window=float("inf")), dict(window="2"),
               dict(window=1.5)):
        with pytest.raises(ValueError, match=r"castle\.forward: window=.*; expected an integer"):
            castle.forward(*x, **kw)
    for capacity in (None, "4", 2.5, 0):
        with pytest.raises(ValueError, match=r"castle\.Cache: capacity=.*; expected an integer in 1\.\."):
            castle.Cache(1, 1, 8, capacity)
    with pytest.raises(ValueError, match=r"castle\.CausalCache: head_dim=300; expected an integer in 1\.\.256"):
        castle.CausalCache(1, 1, 300, 4)
    with pytest.raises(ValueError, match=r"lengths\[0\]=None"):
        castle.Cache(1, 1, 8, 4).prefill(*x, lengths=[None])


def test_a_library_that_is_not_libcastle_is_named(tmp_path):
    import ctypes.util
    import os
    import subprocess
    import sys
    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no libm to stand in for a library that is not libcastle")
    env = dict(os.environ, CASTLE_LIBRARY=libm,
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(castle.__file__))))
    r = subprocess.run([sys.executable, "-c", "import castle"], env=env, capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "AttributeError" not in r.stderr
    assert f"{libm} (CASTLE_LIBRARY): not libcastle" in r.stderr and "missing symbol castle_" in r.stderr


def test_castle_library_is_the_only_one_tried_when_set(tmp_path):
    """README, "Which libcastle it loads": with CASTLE_LIBRARY set nothing else is tried (not even this
    checkout's build, which the other tests load)."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, CASTLE_LIBRARY=str(tmp_path / "libcastle.so"),
               PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(castle.__file__))))
    r = subprocess.run([sys.executable, "-c", "import castle"], env=env, capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    tried = r.stderr.split("Tried:\n", 1)[1].split("\nBuild it", 1)[0].splitlines()
    assert tried == [f"  {tmp_path / 'libcastle.so'} (CASTLE_LIBRARY): not there"]


def test_closing_a_device_waits_for_other_threads_calls(rng):
    """Closing a Device (close(), collection, exit) while another thread's calls run on it waits for
    the call in progress; the thread's next call raises ValueError.  The context was destroyed under
    the running call before: a segfault within a few of these trials."""
    import threading
    import time
    x = six(rng, (1, 2, 64, 16))
    for trial in range(10):
        dev = castle.Device()
        castle.forward(*x, device=dev)  # built (the kernel cache makes later contexts quick)
        errors, calls = [], [0]

        def loop():
            try:
                while True:
                    castle.forward(*x, device=dev)
                    calls[0] += 1
            except BaseException as e:  # noqa: BLE001 (a ValueError is the one expected)
                errors.append(e)

        t = threading.Thread(target=loop)
        t.start()
        time.sleep(0.02 + 0.01 * (trial % 5))
        dev.close()
        t.join(300)
        assert not t.is_alive() and len(errors) == 1 and isinstance(errors[0], ValueError), errors
        assert "is closed" in str(errors[0])


def test_booleans_are_not_integers(rng):
    with pytest.raises(ValueError, match="window=True"):
        castle.forward(*six(rng, (1, 1, 4, 8)), window=True)


def test_exit_while_a_daemon_thread_calls():
    """The interpreter exits while a daemon thread keeps calling: the default device's finalizer
    waits for the call in progress, and buffers and caches are not released under it at exit (their
    finalizers ran at exit before the device's did, under the running call: a segfault in 3 of 8 such
    exits).  The thread's next call raises ValueError; the process exits with status 0.  One thread
    calls: two on the one queue of a Device deadlock inside PoCL's basic driver (docs/building.md)."""
    import subprocess
    import sys
    script = """if True:
        import threading, time, numpy as np, castle
        x = [np.full((1, 2, 10, 8), 0.5, np.float32) for _ in range(6)]
        c = castle.Cache(1, 2, 8, 100000)
        c.prefill(*x)
        def loop():
            while True:
                castle.forward(*x)
                c.decode(*[a[:, :, :1] for a in x])
        threading.Thread(target=loop, daemon=True).start()
        time.sleep(0.3)
    """
    for _ in range(6):
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (r.returncode, r.stderr[-2000:])


def test_a_spec_string_names_one_shared_device(rng):
    """device="0:0" uses one Device per spec (a new context per call cost 30 ms a call before), and a
    new one after it was closed."""
    x = six(rng, (1, 1, 4, 8))
    castle.forward(*x, device="0:0")
    dev = _core._device("0:0")
    assert _core._device("0:0") is dev and not dev.closed
    dev.close()
    castle.forward(*x, device="0:0")
    assert _core._device("0:0") is not dev


def test_a_narrow_view_is_uploaded_alone(rng, monkeypatch):
    """A token of long prompt arrays (x[:, :, t:t+1]) is uploaded as its own bytes, not with every row
    between its first and last element (it uploaded 32 MB a decode step for 8 KB)."""
    import castle._core as core
    sizes = []
    real = core.Buffer.__init__

    def spy(self, device, nbytes, host=None):
        sizes.append(int(nbytes))
        real(self, device, nbytes, host)

    monkeypatch.setattr(core.Buffer, "__init__", spy)
    six_ = [rng.standard_normal((2, 3, 500, 8)).astype(np.float32) for _ in range(6)]
    cache = castle.Cache(2, 3, 8, 500)
    cache.prefill(*[x[:, :, :20] for x in six_])
    sizes.clear()
    o = cache.decode(*[x[:, :, 20:21] for x in six_])
    tensor = 2 * 3 * 1 * 8 * 4
    assert sizes and max(sizes[:6]) <= 2 * tensor + 4096, sizes
    ref = castle.forward(*[x[:, :, :21] for x in six_])[0][:, :, 20:21]
    assert np.abs(o - ref).max() < 1e-5
