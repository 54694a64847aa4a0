"""The caller's GPU arrays as the launcher needs them: pointer, shape, strides in elements, dtype, device, stream.

Accepts torch tensors (read natively, so bfloat16 and float8 work), anything with ``__cuda_array_interface__``
(CuPy, pycuda, numba; v2/v3) and anything with ``__dlpack__`` (capsule parsed with ctypes, no extra
dependency). Outputs are allocated "of the same kind" as a reference input (torch, CuPy, pycuda).

    q = device_array(q_obj, "q")                       # DeviceArray(ptr, shape, strides, dtype, device, kind)
    same_device([q, k, v])                             # -> device ordinal, or a one-line ArrayError
    out = empty_like_kind(q, shape, "float16")         # torch.empty / cupy.empty / gpuarray.empty
    stream = caller_stream(q, stream=None)             # explicit stream wins, else the library's current stream
"""
from __future__ import annotations

import ctypes
import functools
import math
import sys
from typing import Any, NamedTuple, Sequence

DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool", "float8_e4m3fn")
DTYPE_SIZES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int32": 4,
               "int64": 8, "bool": 1, "float8_e4m3fn": 1}

# __cuda_array_interface__ typestr -> dtype. torch and ml_dtypes write bfloat16 as "<V2" and float8 as "|V1".
_TYPESTRS = {"<f2": "float16", "<V2": "bfloat16", "<f4": "float32", "<f8": "float64", "|i1": "int8",
             "|u1": "uint8", "<i4": "int32", "<i8": "int64", "|b1": "bool", "|V1": "float8_e4m3fn"}
# DLPack (type code, bits) -> dtype (kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6, kDLFloat8_e4m3fn 10)
_DLPACK_TYPES = {(2, 16): "float16", (4, 16): "bfloat16", (2, 32): "float32", (2, 64): "float64", (0, 8): "int8",
                 (1, 8): "uint8", (0, 32): "int32", (0, 64): "int64", (6, 8): "bool", (1, 1): "bool",
                 (10, 8): "float8_e4m3fn"}
_DLPACK_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged


class ArrayError(ValueError):
    """An argument is not a usable CUDA device array (host array, wrong dtype, mixed devices, bad layout)."""


class DeviceArray(NamedTuple):
    """One device array as the launcher sees it; ``obj`` is the caller's object (kept alive while in use). A named
    tuple: built on every direct-API call, and a frozen dataclass costs about a microsecond more to make."""

    ptr: int
    shape: tuple
    strides: tuple            # in elements
    dtype: str
    device: int
    kind: str                 # "torch", "cupy", "pycuda" or the producing module's name
    obj: Any = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        """Row-major dense (dims of extent 1 may have any stride)."""
        expected = 1
        for extent, stride in zip(reversed(self.shape), reversed(self.strides)):
            if extent != 1 and stride != expected:
                return False
            expected *= extent
        return True


def _module_of(obj) -> str:
    return type(obj).__module__.split(".")[0]


def contiguous_strides(shape: Sequence[int]) -> tuple:
    """Row-major strides, in elements."""
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return tuple(reversed(strides))


_TORCH_DTYPE_NAMES: dict = {}  # torch.dtype -> its name here, filled on first sight (str() of a dtype is slow)


def _from_torch(t, name: str) -> DeviceArray:
    if not t.is_cuda:
        raise ArrayError(f"{name} is a host array (torch, device {t.device}); pass a CUDA device array: "
                         "torch/CuPy/pycuda")
    dtype = _TORCH_DTYPE_NAMES.get(t.dtype)
    if dtype is None:
        dtype = _TORCH_DTYPE_NAMES.setdefault(t.dtype, str(t.dtype).removeprefix("torch."))
    if dtype not in DTYPES:
        raise ArrayError(f"{name} has dtype {dtype}, which no kernel takes (one of {', '.join(DTYPES)})")
    return DeviceArray(t.data_ptr(), tuple(t.shape), t.stride(), dtype, t.get_device(), "torch", t)


def _pointer_device(ptr: int) -> int:
    """The device ordinal owning ``ptr`` (cuPointerGetAttribute); 0 when that cannot be asked."""
    if not ptr:
        return 0
    from trt_fusedattn.launcher.launch import pointer_device
    return pointer_device(ptr)


def _from_cuda_array_interface(obj, cai: dict, name: str) -> DeviceArray:
    typestr = cai["typestr"]
    dtype = _TYPESTRS.get(typestr)
    if dtype is None:
        raise ArrayError(f"{name} has typestr {typestr!r}, which no kernel takes "
                         f"(one of {', '.join(sorted(_TYPESTRS))})")
    shape = tuple(int(s) for s in cai["shape"])
    itemsize = DTYPE_SIZES[dtype]
    if cai.get("strides") is None:
        strides = contiguous_strides(shape)
    else:
        if any(s % itemsize for s in cai["strides"]):
            raise ArrayError(f"{name} has strides {cai['strides']} bytes, not multiples of its item size {itemsize}")
        strides = tuple(int(s) // itemsize for s in cai["strides"])
    ptr = int(cai["data"][0] or 0)
    kind = _module_of(obj)
    device = int(obj.device.id) if kind == "cupy" else _pointer_device(ptr)
    return DeviceArray(ptr, shape, strides, dtype, device, kind, obj)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _capsule_pointer(capsule, capsule_name: bytes) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, capsule_name)


def parse_dlpack_capsule(capsule) -> tuple:
    """(data pointer, shape, strides in elements, dtype, (device type, device id)) of an unversioned DLPack capsule."""
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))  # DLManagedTensor starts with its DLTensor
    dtype = _DLPACK_TYPES.get((t.dtype.code, t.dtype.bits))
    if dtype is None or t.dtype.lanes != 1:
        raise ArrayError(f"DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits, {t.dtype.lanes} lanes) is not "
                         f"one a kernel takes ({', '.join(DTYPES)})")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else contiguous_strides(shape)
    return (t.data or 0) + t.byte_offset, shape, strides, dtype, (t.device.device_type, t.device.device_id)


def _from_dlpack(obj, name: str, stream: int | None) -> DeviceArray:
    device_type, device_id = obj.__dlpack_device__()
    if device_type not in _DLPACK_CUDA:
        raise ArrayError(f"{name} is a host array ({_module_of(obj)}, DLPack device type {device_type}); "
                         "pass a CUDA device array: torch/CuPy/pycuda")
    try:  # the producer makes its pending work visible to `stream` (DLPack: 1 is the legacy default stream)
        capsule = obj.__dlpack__(stream=stream or 1)
    except TypeError:
        capsule = obj.__dlpack__()
    try:
        ptr, shape, strides, dtype, _ = parse_dlpack_capsule(capsule)
    except ArrayError as exc:
        raise ArrayError(f"{name}: {exc}") from None
    # the capsule is not consumed: collecting it releases the producer's export; obj keeps the memory alive
    return DeviceArray(ptr, shape, strides, dtype, device_id, _module_of(obj), obj)


def device_array(obj, name: str = "array", *, stream: int | None = None) -> DeviceArray:
    """Describe ``obj`` (torch tensor, ``__cuda_array_interface__`` or ``__dlpack__`` object) or raise ArrayError.

    ``name`` is the argument's name in error messages; ``stream`` is passed to a DLPack producer so its pending
    work is ordered before ours."""
    if isinstance(obj, DeviceArray):
        return obj
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _from_torch(obj, name)
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        cai = None
    if cai is not None:
        return _from_cuda_array_interface(obj, cai, name)
    if hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, name, stream)
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array__"):
        raise ArrayError(f"{name} is a host array ({_module_of(obj)}); pass a CUDA device array: torch/CuPy/pycuda")
    raise ArrayError(f"{name} is a {type(obj).__name__}, not a device array; pass a CUDA device array "
                     "(torch/CuPy/pycuda, or anything with __cuda_array_interface__ or __dlpack__)")


def same_device(arrays: Sequence[DeviceArray | None], names: Sequence[str] | None = None) -> int:
    """The one device all given arrays live on (None entries skipped); ArrayError when they differ."""
    present = [(a, (names[i] if names else f"argument {i}")) for i, a in enumerate(arrays) if a is not None]
    first, first_name = present[0]
    for array, name in present[1:]:
        if array.device != first.device:
            raise ArrayError(f"{first_name} is on cuda:{first.device} but {name} on cuda:{array.device}; "
                             "put all arrays on one GPU")
    return first.device


def require(array: DeviceArray, name: str, *, dtypes: Sequence[str] = (), ndim: int | None = None,
            contiguous: bool = False) -> DeviceArray:
    """Check dtype, rank and (if asked) row-major contiguity, each with a one-line ArrayError."""
    if dtypes and array.dtype not in dtypes:
        raise ArrayError(f"{name} has dtype {array.dtype}; expected {' or '.join(dtypes)}")
    if ndim is not None and len(array.shape) != ndim:
        raise ArrayError(f"{name} has shape {array.shape}; expected {ndim} dimensions")
    if contiguous and not array.is_contiguous():
        raise ArrayError(f"{name} (shape {array.shape}, strides {array.strides}) is not contiguous; "
                         "pass a contiguous array (torch: .contiguous(), CuPy: cupy.ascontiguousarray)")
    return array


def empty_like_kind(reference: DeviceArray, shape: Sequence[int], dtype: str, name: str = "out") -> DeviceArray:
    """A new contiguous device array of ``shape``/``dtype`` from the library ``reference`` came from."""
    shape = tuple(int(s) for s in shape)
    if reference.kind == "torch":
        import torch
        obj = torch.empty(shape, dtype=getattr(torch, dtype), device=f"cuda:{reference.device}")
    elif reference.kind == "cupy" and dtype in ("float16", "float32", "float64", "int32", "int64", "int8",
                                                "uint8", "bool"):
        import cupy
        with cupy.cuda.Device(reference.device):
            obj = cupy.empty(shape, dtype=dtype)
    elif reference.kind == "pycuda" and dtype in ("float16", "float32", "float64", "int32", "int64", "bool"):
        import numpy
        from pycuda import gpuarray
        obj = gpuarray.empty(shape, dtype=numpy.dtype(dtype))
    else:
        raise ArrayError(f"cannot allocate {name} ({dtype}) as a {reference.kind} array; pass {name}= "
                         "a preallocated device array")
    return device_array(obj, name)


def stream_handle(stream) -> int:
    """A raw CUstream handle from an int, torch/CuPy/pycuda/cuda-python stream or ``__cuda_stream__`` object."""
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attr in ("cuda_stream", "ptr", "handle"):  # torch, CuPy, pycuda
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    try:
        return int(stream)  # cuda-python CUstream
    except (TypeError, ValueError):
        raise ArrayError(f"stream={stream!r} is not a CUDA stream: pass an int handle or a torch/CuPy/pycuda "
                         "stream") from None


def torch_current_stream(device: int) -> int:
    """torch's current stream on ``device`` as a raw handle (what torch.cuda.current_stream reads, 10x faster)."""
    return torch_stream_query()(device)


@functools.lru_cache(maxsize=None)
def torch_stream_query():
    """torch's raw current-stream query (looked up once: the per-call import and getattr cost ~0.3 us), or the public
    one where a torch build lacks it."""
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw if raw else lambda device: int(torch.cuda.current_stream(device).cuda_stream)


def caller_stream(reference: DeviceArray, stream=None) -> int:
    """The stream to launch on: ``stream`` if given, else the current stream of ``reference``'s library
    (torch, CuPy), else the legacy default stream 0."""
    if stream is not None:
        return stream_handle(stream)
    if reference.kind == "torch":
        return torch_current_stream(reference.device)
    if reference.kind == "cupy":
        import cupy
        with cupy.cuda.Device(reference.device):
            return int(cupy.cuda.get_current_stream().ptr)
    return 0
