"""The one place that knows libcastle's C API (lib/include/castle/castle.h) and the few OpenCL
entry points the package needs: library discovery, ctypes structures mirroring the header, and
argument and result types.  Everything else in the package calls through this module.

Keep the structures here in step with castle.h: the library checks the struct_size this binding passes
(ctypes.sizeof(AttentionDesc)) and refuses a size it does not know with CASTLE_ERR_DESC_VERSION, so a
mismatch fails loudly on the first call (test_numpy.py: test_descriptor_layout_matches_the_library)."""

import ctypes
import ctypes.util
import os

from ctypes import POINTER, c_char_p, c_float, c_int, c_long, c_size_t, c_uint, c_ulong, c_void_p

TENSOR_COUNT = 15  # castle_tensor: QU KU VU QC KC VC O LSE DO DQU DKU DVU DQC DKC DVC
QU, KU, VU, QC, KC, VC, O, LSE, DO, DQU, DKU, DVU, DQC, DKC, DVC = range(TENSOR_COUNT)
MAX_HEAD_DIM = 256


class Layout(ctypes.Structure):
    _fields_ = [("batch_stride", c_size_t), ("head_stride", c_size_t), ("row_stride", c_size_t)]


class AttentionDesc(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("batch", c_size_t),
        ("heads", c_size_t),
        ("seq_len", c_size_t),
        ("head_dim", c_size_t),
        ("window", c_long),
        ("scale", c_float),
        ("layout", Layout * TENSOR_COUNT),
    ]


class Tuning(ctypes.Structure):
    # castle.h's castle_tuning: struct_size, then the fields of CASTLE_TUNING_PARAMS in order
    _fields_ = [("struct_size", c_size_t), ("block", c_uint), ("threads", c_uint), ("dchunk", c_uint),
                ("vector", c_uint), ("tm", c_uint), ("tn", c_uint), ("fold", c_uint), ("decode", c_uint),
                ("bthreads", c_uint), ("btm", c_uint), ("stage", c_uint),
                ("prefetch", c_uint), ("accum", c_uint), ("fthreads", c_uint), ("fdchunk", c_uint),
                ("regs", c_uint), ("fregs", c_uint)]


def c_range(ctype):
    """(lo, hi): the values a ctypes integer type holds.  ctypes wraps anything outside them silently
    (2**64 + 1 into a size_t is 1), so callers check first (_core._int)."""
    bits = 8 * ctypes.sizeof(ctype)
    return (0, 2**bits - 1) if ctype(-1).value > 0 else (-2**(bits - 1), 2**(bits - 1) - 1)


_desc_p = POINTER(AttentionDesc)
_mem6 = [c_void_p] * 6
_tail = [c_void_p, c_uint, c_void_p, c_void_p]  # queue, num_wait_events, wait_events, event

# Every libcastle function the package calls: (result type, argument types).  _load takes a library
# only if it has all of them.
_SIGNATURES = {
    "castle_version_string": (c_char_p, []),
    "castle_status_string": (c_char_p, [c_int]),
    "castle_last_error": (c_char_p, []),
    "castle_context_create_default": (c_int, [c_char_p, POINTER(c_void_p)]),
    "castle_context_create": (c_int, [c_void_p, c_void_p, POINTER(c_void_p)]),
    "castle_context_destroy": (None, [c_void_p]),
    "castle_context_queue": (c_void_p, [c_void_p]),
    "castle_context_device": (c_void_p, [c_void_p]),
    "castle_context_cl_context": (c_void_p, [c_void_p]),
    "castle_context_get_tuning": (c_int, [c_void_p, c_void_p]),
    "castle_context_tuning_name": (c_char_p, [c_void_p]),
    "castle_context_loop_limit": (c_ulong, [c_void_p]),
    "castle_parse_device_spec": (c_int, [c_char_p, POINTER(c_long), POINTER(c_long)]),
    "castle_attention_desc_init_sized": (c_int, [_desc_p, c_size_t, c_size_t, c_size_t, c_size_t, c_size_t]),
    "castle_forward_workspace_size": (c_int, [c_void_p, _desc_p, POINTER(c_size_t)]),
    "castle_forward": (c_int, [c_void_p, _desc_p] + _mem6 + [c_void_p] * 3 + _tail),
    "castle_backward": (c_int, [c_void_p, _desc_p] + _mem6 + [c_void_p] * 4 + _mem6 + _tail),
    "castle_causal_forward": (c_int, [c_void_p, _desc_p] + [c_void_p] * 5 + _tail),
    "castle_causal_backward": (c_int, [c_void_p, _desc_p] + [c_void_p] * 9 + _tail),
    "castle_cache_create": (c_int, [c_void_p, _desc_p, POINTER(c_void_p)]),
    "castle_cache_destroy": (None, [c_void_p]),
    "castle_cache_reset": (c_int, [c_void_p]),
    "castle_cache_bytes": (c_int, [c_void_p, POINTER(c_size_t)]),
    "castle_cache_lengths": (c_int, [c_void_p, POINTER(c_size_t)]),
    "castle_prefill": (c_int, [c_void_p, c_void_p, _desc_p, POINTER(c_size_t)] + _mem6 + [c_void_p] * 2 + _tail),
    "castle_decode": (c_int, [c_void_p, c_void_p, _desc_p] + _mem6 + [c_void_p] * 2 + _tail),
    "castle_kv_cache_create": (c_int, [c_void_p, _desc_p, POINTER(c_void_p)]),
    "castle_kv_cache_destroy": (None, [c_void_p]),
    "castle_kv_cache_reset": (c_int, [c_void_p]),
    "castle_kv_cache_bytes": (c_int, [c_void_p, POINTER(c_size_t)]),
    "castle_kv_cache_length": (c_int, [c_void_p, POINTER(c_size_t)]),
    "castle_causal_prefill": (c_int, [c_void_p, c_void_p, _desc_p] + [c_void_p] * 5 + _tail),
    "castle_causal_decode": (c_int, [c_void_p, c_void_p, _desc_p] + [c_void_p] * 5 + _tail),
}


def _candidates():
    """Where libcastle may be, in the order tried: CASTLE_LIBRARY alone when it is set; otherwise the
    build of the checkout this package sits in (python/castle -> ../../build) or was installed from
    (pip install ./python), then the system's (ctypes.util.find_library and the standard install
    prefixes)."""
    env = os.environ.get("CASTLE_LIBRARY")
    if env:
        return [("CASTLE_LIBRARY", env)]
    here = os.path.dirname(os.path.abspath(__file__))
    out = [("this checkout's build", os.path.join(here, "..", "..", "build", "libcastle.so"))]
    try:  # an installed copy: the checkout `pip install` ran in (written by setup.py)
        from ._checkout import CHECKOUT
        out.append(("the build of the checkout it was installed from", os.path.join(CHECKOUT, "build", "libcastle.so")))
    except ImportError:
        pass
    found = ctypes.util.find_library("castle")
    if found:
        out.append(("installed (find_library)", found))
    for prefix in ("/usr/local/lib", "/usr/lib", "/usr/local/lib64", "/usr/lib64"):
        out.append(("installed", os.path.join(prefix, "libcastle.so")))
    return out


def _load():
    tried = []
    for how, path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} ({how}): not there")
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({how}): {e}")
            continue
        missing = next((fn for fn in _SIGNATURES if not hasattr(lib, fn)), None)
        if missing is not None:
            tried.append(f"{path} ({how}): not libcastle, or an older one than this package (missing symbol {missing})")
            continue
        for fn, (res, args) in _SIGNATURES.items():
            f = getattr(lib, fn)
            f.restype, f.argtypes = res, args
        return lib, os.path.normpath(path) if os.sep in path else path, how
    raise ImportError(
        "castle: libcastle not found. Tried:\n  " + "\n  ".join(tried) + "\n"
        "Build it (cmake -S . -B build && cmake --build build in the libcastle checkout), install it "
        "(cmake --install build), or set CASTLE_LIBRARY=/path/to/libcastle.so."
    )


lib, library_path, library_origin = _load()


def desc_init(desc, batch, heads, seq_len, head_dim):
    """castle_attention_desc_init (a macro in C) with this binding's struct size; the status."""
    return lib.castle_attention_desc_init_sized(ctypes.byref(desc), ctypes.sizeof(AttentionDesc), batch, heads,
                                                seq_len, head_dim)


def _opencl():
    for name in ("OpenCL", "libOpenCL.so.1"):
        path = ctypes.util.find_library(name) if name == "OpenCL" else name
        if path:
            try:
                return ctypes.CDLL(path)
            except OSError:
                pass
    raise ImportError("castle: the OpenCL ICD loader (libOpenCL.so.1) could not be loaded; install ocl-icd-libopencl1")


cl = _opencl()

# OpenCL 1.2 entry points (cl.h), for buffers, transfers and the device list.
CL_MEM_READ_WRITE = 1 << 0
CL_MEM_COPY_HOST_PTR = 1 << 5
CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
CL_PLATFORM_NAME = 0x0902
CL_DEVICE_NAME = 0x102B
CL_DEVICE_VENDOR = 0x102C
CL_DEVICE_TYPE = 0x1000
CL_MEM_CONTEXT = 0x1106
CL_MEM_SIZE = 0x1102
cl.clCreateBuffer.restype = c_void_p
cl.clCreateBuffer.argtypes = [c_void_p, ctypes.c_uint64, c_size_t, c_void_p, POINTER(c_int)]
cl.clReleaseMemObject.argtypes = [c_void_p]
cl.clEnqueueReadBuffer.argtypes = [c_void_p, c_void_p, c_uint, c_size_t, c_size_t, c_void_p, c_uint, c_void_p, c_void_p]
cl.clEnqueueWriteBuffer.argtypes = cl.clEnqueueReadBuffer.argtypes
cl.clFinish.argtypes = [c_void_p]
cl.clGetPlatformIDs.argtypes = [c_uint, c_void_p, POINTER(c_uint)]
cl.clGetDeviceIDs.argtypes = [c_void_p, ctypes.c_uint64, c_uint, c_void_p, POINTER(c_uint)]
cl.clGetPlatformInfo.argtypes = [c_void_p, c_uint, c_size_t, c_void_p, POINTER(c_size_t)]
cl.clGetDeviceInfo.argtypes = [c_void_p, c_uint, c_size_t, c_void_p, POINTER(c_size_t)]
cl.clGetMemObjectInfo.argtypes = [c_void_p, c_uint, c_size_t, c_void_p, POINTER(c_size_t)]
for _f in ("clCreateBuffer", "clReleaseMemObject", "clEnqueueReadBuffer", "clEnqueueWriteBuffer", "clFinish",
           "clGetPlatformIDs", "clGetDeviceIDs", "clGetPlatformInfo", "clGetDeviceInfo", "clGetMemObjectInfo"):
    if getattr(cl, _f).restype is not c_void_p:
        getattr(cl, _f).restype = c_int
