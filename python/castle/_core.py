"""Devices, device buffers and the NumPy / pyopencl front end of libcastle."""

import contextlib
import ctypes
import math
import numbers
import operator
import os
import threading
import weakref
from collections import namedtuple

import numpy as np

from . import _lib
from ._lib import cl, lib

F32 = np.dtype(np.float32)


class CastleError(RuntimeError):
    """A libcastle call failed.  .status is the castle_status (a library code or an OpenCL error
    code), .name its name ("CASTLE_ERR_CACHE_FULL", "CL_OUT_OF_RESOURCES", ...), .message the
    library's message (castle_last_error)."""

    def __init__(self, status, message, call=""):
        self.status = int(status)
        self.name = lib.castle_status_string(self.status).decode()
        self.message = message
        body = message[len(self.name) + 2:] if message.startswith(self.name + ": ") else message
        if call and body.startswith(call + ": "):  # the library's message names the call already
            body = body[len(call) + 2:]
        super().__init__(f"{call}: {self.name}: {body}" if call else f"{self.name}: {body}")


def _check(status, call):
    if status != 0:
        raise CastleError(status, lib.castle_last_error().decode(errors="replace"), call)


def _cl_check(err, call):
    if err != 0:
        raise CastleError(err, "the OpenCL call failed", call)


def _int(fn, name, v, ctype, lo=None, hi=None, what=""):
    """v as a Python int for a C field of type ctype (ctypes.c_size_t, c_long, ...), in lo..hi, which
    default to the type's range (ctypes would wrap a value outside it silently); else ValueError naming
    the argument.  Takes ints, NumPy integers and integral floats (2.0)."""
    tlo, thi = _lib.c_range(ctype)
    lo, hi = tlo if lo is None else max(lo, tlo), thi if hi is None else min(hi, thi)
    try:
        n = None if isinstance(v, (bool, np.bool_)) else operator.index(v)  # True is not a window of 1
    except TypeError:
        real = isinstance(v, numbers.Real) and math.isfinite(v) and float(v).is_integer()
        n = int(v) if real else None
    if n is None or not lo <= n <= hi:
        raise ValueError(f"{fn}: {name}={v!r}; expected an integer in {lo}..{hi}{what}")
    return n


def _scale(fn, scale):
    """The descriptor's float scale for scale (None: 0.0, which the library reads as 1/sqrt(d)); else
    ValueError unless scale is a real number that stays finite and > 0 as a float32 (a positive scale
    that rounds to 0 would silently become the default)."""
    if scale is None:
        return 0.0
    try:
        s = ctypes.c_float(float(scale)).value if isinstance(scale, numbers.Real) else None
    except OverflowError:  # an int past float64
        s = math.inf
    if s is None or not (math.isfinite(s) and s > 0):
        raise ValueError(f"{fn}: scale={scale!r}; expected a real number > 0, finite and nonzero as a float32 "
                         "(None = 1/sqrt(d))")
    return s


# ---- devices ---------------------------------------------------------------------------------

DeviceInfo = namedtuple("DeviceInfo", "spec index platform name vendor type")


def _info_str(fn, obj, what):
    n = ctypes.c_size_t(0)
    if fn(obj, what, 0, None, ctypes.byref(n)) != 0 or n.value == 0:
        return ""
    buf = ctypes.create_string_buffer(n.value)
    if fn(obj, what, n.value, buf, None) != 0:
        return ""
    return buf.value.decode(errors="replace")


def devices():
    """The OpenCL devices castle-info lists, in its order: DeviceInfo(spec "P:D", index N (the
    "N" spec), platform name, device name, vendor, type "CPU"/"GPU"/"ACCELERATOR"/"OTHER")."""
    n = ctypes.c_uint(0)
    if cl.clGetPlatformIDs(0, None, ctypes.byref(n)) != 0 or n.value == 0:
        return []
    plats = (ctypes.c_void_p * n.value)()
    _cl_check(cl.clGetPlatformIDs(n.value, plats, None), "clGetPlatformIDs")
    out = []
    for p, plat in enumerate(plats):
        m = ctypes.c_uint(0)
        if cl.clGetDeviceIDs(plat, _lib.CL_DEVICE_TYPE_ALL, 0, None, ctypes.byref(m)) != 0:
            continue
        devs = (ctypes.c_void_p * m.value)()
        if cl.clGetDeviceIDs(plat, _lib.CL_DEVICE_TYPE_ALL, m.value, devs, None) != 0:
            continue
        pname = _info_str(cl.clGetPlatformInfo, plat, _lib.CL_PLATFORM_NAME)
        for d, dev in enumerate(devs):
            t = ctypes.c_uint64(0)
            cl.clGetDeviceInfo(dev, _lib.CL_DEVICE_TYPE, 8, ctypes.byref(t), None)
            kind = "GPU" if t.value & 4 else "CPU" if t.value & 2 else "ACCELERATOR" if t.value & 8 else "OTHER"
            out.append(DeviceInfo(f"{p}:{d}", len(out), pname, _info_str(cl.clGetDeviceInfo, dev, _lib.CL_DEVICE_NAME),
                                  _info_str(cl.clGetDeviceInfo, dev, _lib.CL_DEVICE_VENDOR), kind))
    return out


class _Guard:
    """The calls in progress on a Device's context, by thread, so that closing it (close(), garbage
    collection, interpreter exit) waits for other threads' calls to end instead of destroying the
    context under them (castle.h: castle_context_destroy must not overlap another call); a call that
    begins once closing has begun raises ValueError."""

    def __init__(self):
        self.cond = threading.Condition()
        self.busy = {}  # thread id -> calls in progress
        self.closed = False

    @contextlib.contextmanager
    def use(self, dev):
        me = threading.get_ident()
        with self.cond:
            if self.closed:
                raise ValueError(f"{dev!r} is closed")
            self.busy[me] = self.busy.get(me, 0) + 1
        try:
            yield dev
        finally:
            with self.cond:
                self.busy[me] -= 1
                if not self.busy[me]:
                    del self.busy[me]
                    self.cond.notify_all()

    def close(self):
        """Refuses new calls, then waits for other threads' calls in progress (not this thread's)."""
        me = threading.get_ident()
        with self.cond:
            self.closed = True
            self.cond.wait_for(lambda: not any(t != me for t in self.busy))


class Device:
    """A libcastle context on one OpenCL device, with its in-order command queue.

    Device(spec) takes "P:D" (platform P, device D), "N" (the N-th device across platforms) or
    None (the environment variable CASTLE_DEVICE, else "0:0"), as castle-info numbers them.
    Device.from_pyopencl(queue) binds to a pyopencl queue's context and device instead, so that
    pyopencl arrays on that context are used in place (zero copy)."""

    def __init__(self, spec=None, *, _handle=None, _pyopencl_queue=None):
        if _handle is None:
            h = ctypes.c_void_p()
            arg = None if spec is None else str(spec).encode()
            _check(lib.castle_context_create_default(arg, ctypes.byref(h)), "castle_context_create_default")
            _handle = h.value
            self.spec = spec if spec is not None else os.environ.get("CASTLE_DEVICE") or "0:0"
        else:
            self.spec = spec
        self._caches = []  # finalizers of the caches made on this context: they go before it does
        self._guard = _Guard()
        self._finalizer = weakref.finalize(self, _destroy_context, _handle, self._caches, self._guard)
        self._pyopencl_queue = _pyopencl_queue
        q = _pyopencl_queue.int_ptr if _pyopencl_queue is not None else lib.castle_context_queue(_handle)
        self._raw = (_handle, q, lib.castle_context_cl_context(_handle), lib.castle_context_device(_handle))
        self.name = _info_str(cl.clGetDeviceInfo, self._raw[3], _lib.CL_DEVICE_NAME)

    @classmethod
    def from_pyopencl(cls, queue):
        """A Device on a pyopencl CommandQueue's context and device; calls enqueue on that queue, which
        must be in order (the package's calls and reads follow each other on it without events)."""
        import pyopencl as cl

        if queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE:
            raise ValueError("castle.Device.from_pyopencl: the queue is out of order; the package orders its "
                             "calls and reads by the queue, so it needs an in-order queue")
        h = ctypes.c_void_p()
        _check(lib.castle_context_create(queue.context.int_ptr, queue.device.int_ptr, ctypes.byref(h)),
               "castle_context_create")
        return cls(f"pyopencl:{queue.device.name}", _handle=h.value, _pyopencl_queue=queue)

    @property
    def closed(self):
        """Whether close() ran or is running (or the context is otherwise gone)."""
        return self._guard.closed or not self._finalizer.alive

    def _open(self):
        """self, or ValueError once the device is closed: every use of its context, queue and OpenCL
        handles goes through here (the properties below, and _device() for every device= argument)."""
        if self.closed:
            raise ValueError(f"{self!r} is closed")
        return self

    def _use(self):
        """with dev._use(): a call on the context, which close() waits for (_Guard)."""
        return self._guard.use(self)

    def __copy__(self):
        return self  # one context: a copy of a module or a structure holding a Device shares it

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        if self._pyopencl_queue is not None and str(self.spec).startswith("pyopencl:"):
            raise TypeError(f"{self!r} is bound to a pyopencl queue and cannot be pickled")
        return (Device, (self.spec,))  # unpickled: a Device on the same device spec

    _handle = property(lambda self: self._open()._raw[0], doc="The castle_context *.")
    queue = property(lambda self: self._open()._raw[1],
                     doc="The cl_command_queue every call of this package enqueues on.")
    cl_context = property(lambda self: self._open()._raw[2], doc="The cl_context.")
    cl_device = property(lambda self: self._open()._raw[3], doc="The cl_device_id.")

    def _own(self, finalizer):
        """Registers the finalizer of a cache made on this context: close() runs it first."""
        self._caches[:] = [f for f in self._caches if f.alive] + [finalizer]

    @property
    def pyopencl_queue(self):
        """This device's queue as a pyopencl.CommandQueue (for making arrays the calls use in place)."""
        self._open()
        if self._pyopencl_queue is None:
            import pyopencl
            self._pyopencl_queue = pyopencl.CommandQueue.from_int_ptr(self.queue, retain=True)
        return self._pyopencl_queue

    @property
    def tuning(self):
        # castle_context_get_tuning writes the library's castle_tuning (struct_size first): a library
        # whose castle_tuning gained fields writes more than _lib.Tuning holds, so it writes into spare
        # room and the known fields are read from its start.
        room = (ctypes.c_char * (ctypes.sizeof(_lib.Tuning) + 256))()
        with self._use():
            _check(lib.castle_context_get_tuning(self._handle, room), "castle_context_get_tuning")
            name = lib.castle_context_tuning_name(self._handle).decode()
        t = _lib.Tuning.from_buffer(room)
        return {f: getattr(t, f) for f, _ in _lib.Tuning._fields_ if f != "struct_size"} | {"name": name}

    @property
    def loop_limit(self):
        """Loop iterations one work-item may run on this device, 0 for no limit (65535 on Mesa's
        llvmpipe, or CASTLE_LOOP_LIMIT). The library runs longer loops in pieces; what still would not
        fit (a decode call of very many tokens) raises CastleError (CASTLE_ERR_DEVICE_UNSUPPORTED)."""
        with self._use():
            return lib.castle_context_loop_limit(self._handle)

    def finish(self):
        with self._use():
            _cl_check(cl.clFinish(self.queue), "clFinish")

    def close(self):
        """Releases the context now, and with it the caches made on it (castle.h: a cache's context
        must outlive it); later use of the device or of those caches raises ValueError.  Buffers
        and arrays made on it stay safe to drop.  Closing twice does nothing."""
        self._finalizer()

    def __repr__(self):
        return f"castle.Device({self.spec!r}: {self.name})"


def _destroy_context(handle, caches, guard):
    """A Device's finalizer (close(), garbage collection or exit): once no other thread's call is in
    progress on it, its caches, then its context.  OpenCL buffers made on the context hold their own
    reference to the cl_context, so they may go later."""
    guard.close()
    for f in caches:
        f()
    lib.castle_context_destroy(handle)


_default = None


def default_device():
    """The Device every call without device= uses, created on first use (CASTLE_DEVICE, else 0:0)
    and again after it was closed."""
    global _default
    if _default is None or _default.closed:
        _default = Device()
    return _default


_named = {}  # spec -> the Device a device="P:D" argument uses
_named_lock = threading.Lock()


def _device(device):
    """device= as a Device: None the default device, a Device itself, a spec ("P:D", "N") one Device
    per spec, made on first use and again after it was closed (a context per call cost 30 ms)."""
    if device is None:
        return default_device()
    if isinstance(device, Device):
        return device._open()
    key = str(device)
    with _named_lock:
        dev = _named.get(key)
        if dev is None or dev.closed:
            dev = _named[key] = Device(key)
        return dev


# ---- buffers -------------------------------------------------------------------------------------

class Buffer:
    """A cl_mem this package owns (released when the object goes)."""

    def __init__(self, device, nbytes, host=None):
        err = ctypes.c_int(0)
        flags = _lib.CL_MEM_READ_WRITE | (_lib.CL_MEM_COPY_HOST_PTR if host is not None else 0)
        mem = cl.clCreateBuffer(device.cl_context, flags, max(int(nbytes), 4), host, ctypes.byref(err))
        _cl_check(err.value, f"clCreateBuffer({nbytes} bytes)")
        self.mem, self.nbytes = mem, int(nbytes)
        self._finalizer = weakref.finalize(self, cl.clReleaseMemObject, mem)
        self._finalizer.atexit = False  # at exit a daemon thread's call may still use it (_Guard)

    def read(self, device, shape):
        out = np.empty(shape, F32)
        if out.nbytes:
            _cl_check(cl.clEnqueueReadBuffer(device.queue, self.mem, 1, 0, out.nbytes, out.ctypes.data, 0, None, None),
                      "clEnqueueReadBuffer")
        return out


def _pyopencl_array_type():
    try:
        import pyopencl.array
    except ImportError:
        return None
    return pyopencl.array.Array


class Tensor:
    """One (B, H, L, d) input as the library sees it: a cl_mem, its element strides and what keeps
    the memory alive."""

    __slots__ = ("mem", "layout", "keep", "shape")

    def __init__(self, mem, layout, keep, shape):
        self.mem, self.layout, self.keep, self.shape = mem, layout, keep, shape


def _float32(fn, name, x):
    dt = np.dtype(x.dtype)
    if not (np.issubdtype(dt, np.floating) or np.issubdtype(dt, np.integer)):
        raise ValueError(f"{fn}: {name} has dtype {dt}; expected float32 (real numbers are converted)")
    return dt


def _native_strides(shape, strides, itemsize):
    """Element strides (batch, head, row) for memory the library can read in place, or None.  Axes
    of extent 1 get a harmless stride (any value reads the same elements)."""
    if len(strides) != 4 or strides[3] != itemsize and shape[3] > 1:
        return None
    out = []
    for n, s, dflt in zip(shape[:3], strides[:3], (0, 0, shape[3])):
        if n == 1:
            out.append(dflt)
        elif s <= 0 or s % itemsize:
            return None
        else:
            out.append(s // itemsize)
    if shape[2] > 1 and out[2] < shape[3]:
        return None
    return out


def _span(shape, st):
    return (sum((n - 1) * s for n, s in zip(shape[:3], st)) + shape[3]) * 4


def upload(device, x, fn="castle", name="x", ndim=4):
    """A Tensor for array x on device: a pyopencl array on the device's context is used in place;
    anything else becomes float32 host memory (read in place when its last axis is contiguous and
    the memory its rows span is not much more than its own, else copied once) and is copied to a new
    device buffer."""
    arr_t = _pyopencl_array_type()
    if arr_t is not None and isinstance(x, arr_t):
        _float32(fn, name, x)
        if x.context.int_ptr != ctypes.c_void_p(device.cl_context).value:
            raise ValueError(f"{fn}: {name} is a pyopencl array on another OpenCL context than the device's "
                             "(use castle.Device.from_pyopencl(queue) or device.pyopencl_queue)")
        if x.dtype != F32:
            x = x.astype(F32)
        st = _native_strides(x.shape, x.strides, 4) if x.ndim == 4 else None
        if st is None or x.offset:
            x = x.copy() if x.flags.c_contiguous else _contiguous_cl(x)
            st = [0, 0, 0]
        x.finish()
        return Tensor(x.base_data.int_ptr, st, x, x.shape)
    x = np.asarray(x)
    _float32(fn, name, x)
    if x.ndim != ndim:
        raise ValueError(f"{fn}: {name} has shape {x.shape}; expected {ndim} dimensions (batch, heads, L, d)")
    if x.dtype != F32:
        x = x.astype(F32)
    st = _native_strides(x.shape, x.strides, 4)
    # a view that spans much more than its elements (a token of a long prompt: x[:, :, t:t+1]) is
    # copied, not uploaded with everything between its rows (32 MB a step for 8 KB, or more than
    # the device can allocate)
    if st is None or _span(x.shape, st) > 2 * x.nbytes + 4096:
        x = np.ascontiguousarray(x)
        st = _native_strides(x.shape, x.strides, 4)
    buf = Buffer(device, _span(x.shape, st), x.ctypes.data if x.size else None)
    return Tensor(buf.mem, st, buf, x.shape)


def _contiguous_cl(x):
    """A C-contiguous copy of a pyopencl array of any strides and offset (pyopencl's get() and
    copy() take contiguous arrays only): the bytes it spans are read from its buffer, viewed with
    its strides, made contiguous and uploaded."""
    import pyopencl
    import pyopencl.array
    if x.size == 0:
        return pyopencl.array.empty(x.queue, x.shape, x.dtype)
    lo = sum(min(0, (n - 1) * s) for n, s in zip(x.shape, x.strides))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(x.shape, x.strides)) + x.dtype.itemsize
    span = np.empty(hi - lo, np.uint8)
    pyopencl.enqueue_copy(x.queue, span, x.base_data, src_offset=x.offset + lo, wait_for=x.events,
                          is_blocking=True)
    view = np.ndarray(x.shape, x.dtype, buffer=span, offset=-lo, strides=x.strides)
    return pyopencl.array.to_device(x.queue, np.ascontiguousarray(view))


def uploads(device, fn, names, arrays, shape=None, same=True):
    """Tensors for several arrays; checks they are 4-D with one shape (naming the argument)."""
    for name, x in zip(names, arrays):  # every shape checked before anything is uploaded
        if x is None:
            raise ValueError(f"{fn}: {name} is None")
        shp = tuple(x.shape) if hasattr(x, "shape") else np.shape(x)
        if len(shp) != 4:
            raise ValueError(f"{fn}: {name} has shape {shp}; expected (batch, heads, L, d)")
        if shape is None:
            shape = shp
        elif same and shp != shape:
            raise ValueError(f"{fn}: {name} has shape {shp}, {names[0]} has {shape}; all must be equal")
    if shape[3] < 1 or shape[3] > _lib.MAX_HEAD_DIM:
        raise ValueError(f"{fn}: {names[0]} has head dim {shape[3]}; expected 1..{_lib.MAX_HEAD_DIM}")
    if 0 in shape:
        raise ValueError(f"{fn}: {names[0]} has shape {shape}; every extent must be at least 1")
    return shape, [upload(device, x, fn, name) for name, x in zip(names, arrays)]


def make_desc(fn, shape, window=0, scale=None, layouts=()):
    """castle_attention_desc for (B, H, L, d), with the given (tensor index, Tensor) layouts; fn names
    the call in errors about window and scale."""
    d = _lib.AttentionDesc()
    window = _int(fn, "window", window, ctypes.c_long, lo=0, what=" (0 = CASTLE, W >= 1 = CASTLE-SWL)")
    scale = _scale(fn, scale)
    sizes = [_int(fn, n, v, ctypes.c_size_t) for n, v in zip(("batch", "heads", "L", "d"), shape)]
    _check(_lib.desc_init(d, *sizes), "castle_attention_desc_init")
    d.window, d.scale = window, scale
    for t, ten in layouts:
        _set_layout(d, t, ten)
    return d


class Outputs:
    """Output buffers: pyopencl arrays when the inputs were pyopencl arrays, else Buffers read
    back into NumPy arrays."""

    def __init__(self, device, cl_mode):
        self.device, self.cl_mode, self.items = device, cl_mode, []

    def new(self, shape):
        if self.cl_mode:
            import pyopencl.array
            a = pyopencl.array.empty(self.device.pyopencl_queue, shape, F32)
            self.items.append(a)
            return a.data.int_ptr
        b = Buffer(self.device, int(np.prod(shape)) * 4)
        self.items.append((b, shape))
        return b.mem

    def results(self):
        if self.cl_mode:
            # each array carries a marker of the call, so that a read on another queue (whose get()
            # waits for .events) waits for the kernels that wrote it
            import pyopencl
            marker = pyopencl.enqueue_marker(self.device.pyopencl_queue)
            for a in self.items:
                a.add_event(marker)
            return tuple(self.items)
        return tuple(b.read(self.device, shape) for b, shape in self.items)


def _cl_mode(arrays):
    arr_t = _pyopencl_array_type()
    return arr_t is not None and any(isinstance(x, arr_t) for x in arrays)


def _mems(tensors):
    return [t.mem for t in tensors]


# ---- the NumPy functions -------------------------------------------------------------------------

SIX = ("qu", "ku", "vu", "qc", "kc", "vc")


def workspace(device, desc, fn):
    """The workspace castle_forward needs for desc; fn (the caller's name) names its errors: the size
    query is the first library call to check desc (a scale above 65536 was reported as
    castle_forward_workspace_size's error)."""
    n = ctypes.c_size_t(0)
    _check(lib.castle_forward_workspace_size(device._handle, ctypes.byref(desc), ctypes.byref(n)), fn)
    return Buffer(device, n.value)


def _forward(fn, dev, ins, shape, window, scale, outs):
    """castle_forward for the Tensors ins; fn (the caller's name) for argument errors."""
    desc = make_desc(fn, shape, window, scale, zip(range(6), ins))
    o, lse = outs.new(shape), outs.new(shape[:3])
    ws = workspace(dev, desc, fn)
    _check(lib.castle_forward(dev._handle, ctypes.byref(desc), *_mems(ins), o, lse, ws.mem, dev.queue, 0, None, None),
           "castle_forward")
    return desc, o, lse, ws


def forward(qu, ku, vu, qc, kc, vc, window=0, scale=None, device=None):
    """CASTLE (window 0) or CASTLE-SWL (window W >= 1) attention: (o, lse) for six (B, H, L, d)
    float32 arrays; o is (B, H, L, d), lse (B, H, L).  scale None means 1/sqrt(d)."""
    with _device(device)._use() as dev:
        arrays = (qu, ku, vu, qc, kc, vc)
        shape, ins = uploads(dev, "castle.forward", SIX, arrays)
        outs = Outputs(dev, _cl_mode(arrays))
        _forward("castle.forward", dev, ins, shape, window, scale, outs)
        return outs.results()


def _set_layout(desc, t, tensor):
    lay = desc.layout[t]
    lay.batch_stride, lay.head_stride, lay.row_stride = tensor.layout


def _backward(dev, desc, ins, o, lse, ws, do, outs):
    """castle_backward from the forward's state (ins, o, lse, ws) and do (a Tensor); six gradients."""
    _set_layout(desc, _lib.DO, do)
    grads = [outs.new(ins[0].shape) for _ in range(6)]
    _check(lib.castle_backward(dev._handle, ctypes.byref(desc), *_mems(ins), o, lse, ws.mem, do.mem, *grads,
                               dev.queue, 0, None, None), "castle_backward")


def backward(qu, ku, vu, qc, kc, vc, do, window=0, scale=None, device=None):
    """Gradients (dqu, dku, dvu, dqc, dkc, dvc) of a loss whose gradient with respect to CASTLE's
    output o is do.  Runs the forward first (its workspace feeds the backward); castle.torch keeps
    the forward's state instead."""
    with _device(device)._use() as dev:
        arrays = (qu, ku, vu, qc, kc, vc, do)
        shape, ins = uploads(dev, "castle.backward", SIX + ("do",), arrays)
        scratch = Outputs(dev, False)  # keeps o and lse alive until the backward is done
        desc, o, lse, ws = _forward("castle.backward", dev, ins[:6], shape, window, scale, scratch)
        outs = Outputs(dev, _cl_mode(arrays))
        _backward(dev, desc, ins[:6], o, lse, ws, ins[6], outs)
        return outs.results()


def _causal_forward(fn, dev, ins, shape, scale, outs):
    desc = make_desc(fn, shape, 0, scale, zip((_lib.QC, _lib.KC, _lib.VC), ins))
    o, lse = outs.new(shape), outs.new(shape[:3])
    _check(lib.castle_causal_forward(dev._handle, ctypes.byref(desc), *_mems(ins), o, lse, dev.queue, 0, None, None),
           "castle_causal_forward")
    return desc, o, lse


def _causal_backward(dev, desc, ins, o, lse, do, outs):
    _set_layout(desc, _lib.DO, do)
    grads = [outs.new(ins[0].shape) for _ in range(3)]
    _check(lib.castle_causal_backward(dev._handle, ctypes.byref(desc), *_mems(ins), o, lse, do.mem, *grads,
                                      dev.queue, 0, None, None), "castle_causal_backward")


def causal_forward(q, k, v, scale=None, device=None):
    """The library's causal softmax attention (the baseline): (o, lse) for (B, H, L, d) q, k, v."""
    with _device(device)._use() as dev:
        shape, ins = uploads(dev, "castle.causal_forward", ("q", "k", "v"), (q, k, v))
        outs = Outputs(dev, _cl_mode((q, k, v)))
        _causal_forward("castle.causal_forward", dev, ins, shape, scale, outs)
        return outs.results()


def causal_backward(q, k, v, do, scale=None, device=None):
    """Gradients (dq, dk, dv) of the baseline given do = dLoss/do (runs its forward first)."""
    with _device(device)._use() as dev:
        arrays = (q, k, v, do)
        shape, ins = uploads(dev, "castle.causal_backward", ("q", "k", "v", "do"), arrays)
        scratch = Outputs(dev, False)
        desc, o, lse = _causal_forward("castle.causal_backward", dev, ins[:3], shape, scale, scratch)
        outs = Outputs(dev, _cl_mode(arrays))
        _causal_backward(dev, desc, ins[:3], o, lse, ins[3], outs)
        return outs.results()


class _CacheBase:
    """What both caches share: creation from a (batch, heads, capacity, head_dim) descriptor, shape
    checks of the new tokens, the calls that append them, reset and nbytes."""

    _names = SIX
    _slots = tuple(range(6))
    _kind = "castle.Cache"

    def __init__(self, batch, heads, head_dim, capacity, window, scale, device, create, destroy):
        self.device = _device(device)
        self.batch, self.heads, self.head_dim, self.capacity = (
            _int(self._kind, name, v, ctypes.c_size_t, lo=1, hi=hi)
            for name, v, hi in (("batch", batch, None), ("heads", heads, None),
                                ("head_dim", head_dim, _lib.MAX_HEAD_DIM), ("capacity", capacity, None)))
        self.window, self.scale = window, scale
        desc = make_desc(self._kind, (self.batch, self.heads, self.capacity, self.head_dim), window, scale)
        h = ctypes.c_void_p()
        with self.device._use():
            _check(create(self.device._handle, ctypes.byref(desc), ctypes.byref(h)), create.__name__)
            self._cache = h.value
            self._finalizer = weakref.finalize(self, destroy, h.value)
            self._finalizer.atexit = False  # at exit its device's finalizer runs it, after the calls in progress
            self.device._own(self._finalizer)  # closing the device closes the cache first

    def __reduce__(self):
        raise TypeError(f"{self._kind} holds device memory of its castle.Device: it cannot be copied or pickled")

    def __copy__(self):
        self.__reduce__()

    def __deepcopy__(self, memo):
        self.__reduce__()

    @property
    def _handle(self):
        if not self._finalizer.alive:
            why = f": {self.device!r} was closed, and the caches made on it with it" if self.device.closed else ""
            raise ValueError(f"{self._kind} is closed{why}")
        return self._cache

    def _run(self, fn, call, arrays, *extra):
        """Uploads the new tokens, runs call(ctx, cache, desc, *extra, inputs..., o, lse=NULL, queue...)
        and returns o."""
        with self._use():
            return self._run_on(fn, call, arrays, *extra)

    def _run_on(self, fn, call, arrays, *extra):
        cache = self._handle
        shape, ins = uploads(self.device, f"{self._kind}.{fn}", self._names, arrays)
        want = (self.batch, self.heads, self.head_dim)
        if (shape[0], shape[1], shape[3]) != want:
            raise ValueError(f"{self._kind}.{fn}: {self._names[0]} has shape {shape}; this cache takes "
                             f"({want[0]}, {want[1]}, n, {want[2]})")
        desc = make_desc(f"{self._kind}.{fn}", shape, self.window, self.scale, zip(self._slots, ins))
        outs = Outputs(self.device, _cl_mode(arrays))
        o = outs.new(shape)
        _check(call(self.device._handle, cache, ctypes.byref(desc), *extra, *_mems(ins), o, None,
                    self.device.queue, 0, None, None), call.__name__)
        return outs.results()[0]

    def _size(self, call):
        n = ctypes.c_size_t(0)
        self._host_call(call, ctypes.byref(n))
        return n.value

    def _host_call(self, call, *args):
        """A call on the cache that enqueues nothing (lengths, reset, the sizes)."""
        with self._use():
            _check(call(self._handle, *args), call.__name__)

    def _use(self):
        """with cache._use(): a call on the cache (ValueError naming the cache once it is closed),
        which closing its device waits for."""
        self._handle  # noqa: B018 (raises once closed)
        return self.device._use()


class Cache(_CacheBase):
    """The UQ-KV cache of one attention layer for generation (docs/algorithm.md section 5): prefill() a prompt,
    then decode() one or more tokens per call; the outputs equal castle.forward over the whole
    sequence.  capacity is the most tokens one sequence may hold; more raises CastleError
    CASTLE_ERR_CACHE_FULL and leaves the cache unchanged."""

    def __init__(self, batch, heads, head_dim, capacity, window=0, scale=None, device=None):
        super().__init__(batch, heads, head_dim, capacity, window, scale, device, lib.castle_cache_create,
                         lib.castle_cache_destroy)

    def prefill(self, qu, ku, vu, qc, kc, vc, lengths=None):
        """Fills the empty cache with a prompt of P tokens (B, H, P, d); lengths (B integers <= P)
        gives shorter prompts per sequence.  Returns o (B, H, P, d) (rows past a sequence's length
        are unspecified)."""
        plen = None
        if lengths is not None:
            fn = "castle.Cache.prefill"
            if np.shape(lengths) != (self.batch,):
                raise ValueError(f"{fn}: lengths has shape {np.shape(lengths)}; expected {self.batch} integers >= 0")
            plen = (ctypes.c_size_t * self.batch)(*(_int(fn, f"lengths[{b}]", n, ctypes.c_size_t)
                                                     for b, n in enumerate(lengths)))
        return self._run("prefill", lib.castle_prefill, (qu, ku, vu, qc, kc, vc), plen)

    def decode(self, qu, ku, vu, qc, kc, vc):
        """Appends n >= 1 tokens (B, H, n, d) to every sequence; returns their outputs (B, H, n, d)."""
        return self._run("decode", lib.castle_decode, (qu, ku, vu, qc, kc, vc))

    @property
    def lengths(self):
        """Tokens each sequence holds, a NumPy int64 array of length batch."""
        n = (ctypes.c_size_t * self.batch)()
        self._host_call(lib.castle_cache_lengths, n)
        return np.array(n[:], dtype=np.int64)

    def reset(self):
        """Every sequence back to length 0 (nothing reallocated)."""
        self._host_call(lib.castle_cache_reset)

    @property
    def nbytes(self):
        """Device memory the cache holds, bytes."""
        return self._size(lib.castle_cache_bytes)


class CausalCache(_CacheBase):
    """The KV cache of the baseline (castle_kv_cache): prefill(q, k, v) a prompt, decode(q, k, v)
    n >= 1 tokens per call; every sequence of the batch has the same length."""

    _names = ("q", "k", "v")
    _slots = (_lib.QC, _lib.KC, _lib.VC)
    _kind = "castle.CausalCache"

    def __init__(self, batch, heads, head_dim, capacity, scale=None, device=None):
        super().__init__(batch, heads, head_dim, capacity, 0, scale, device, lib.castle_kv_cache_create,
                         lib.castle_kv_cache_destroy)

    def prefill(self, q, k, v):
        return self._run("prefill", lib.castle_causal_prefill, (q, k, v))

    def decode(self, q, k, v):
        return self._run("decode", lib.castle_causal_decode, (q, k, v))

    @property
    def lengths(self):
        """Tokens each sequence holds (all equal), a NumPy int64 array of length batch."""
        return np.full(self.batch, self._size(lib.castle_kv_cache_length), dtype=np.int64)

    def reset(self):
        self._host_call(lib.castle_kv_cache_reset)

    @property
    def nbytes(self):
        return self._size(lib.castle_kv_cache_bytes)
