"""``attention(q, k, v, ...)``: the FusedAttention kernel on the caller's device arrays (torch, CuPy, pycuda,
``__cuda_array_interface__`` or DLPack), on the caller's stream, returning an output of the same kind.

It launches exactly the PTX and launch plan a TensorRT engine would (``plan_attention``). The checks, the plan and
the loaded kernel with its converted arguments are cached per (shapes, strides, dtypes, devices, attributes); torch
tensors, the common case of an inference server, are looked up by their own attributes without building a
description of each array, so a repeated call does only the pointer bookkeeping and the launch (issue 10 item 3:
<= 15 us per call; NOTES.md "Host overhead of the direct API")."""
from __future__ import annotations

import functools
import sys
from typing import NamedTuple

from trt_fusedattn.launcher import (ArrayError, DeviceArray, caller_stream, device_arch, device_array, empty_like_kind,
                                    require, same_device, stream_handle, torch_stream_query)
from trt_fusedattn.launcher.launch import PreparedLaunch
from trt_fusedattn.plugins.attention import output_dtype_attention
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.plan import plan_attention

NAMES = ("q", "k", "v", "mask", "key_lengths")
# The attributes a call passes, in the order of the cache key (the contract's names).
ATTRIBUTES = ("layout", "scale", "softcap", "causal", "causal_alignment", "q_scale", "k_scale", "v_scale", "p_scale",
              "output_dtype", "output_scale")
TORCH_FAST_ENTRIES = 1024  # shapes remembered by the torch fast path (cleared when full: decode grows by a key a step)


class Prepared(NamedTuple):
    """What a call of one (array layout, attributes) key needs: the launch, and O's shape, dtype and device."""
    launch: PreparedLaunch
    out_shape: tuple
    out_dtype: str
    device: int


def _aligned(ptr: int, name: str) -> None:
    if ptr % 16:
        raise ArrayError(f"{name} starts at 0x{ptr:x}, not 16-byte aligned; pass an array that owns its "
                         "memory (e.g. .contiguous() of a fresh tensor)")


@functools.lru_cache(maxsize=1024)
def _prepared(layouts: tuple, attrs: tuple) -> Prepared:
    """The prepared launch for arrays of these (shape, strides, dtype, device) (None when absent) and attributes;
    raises the one-line errors of the checks and the plan."""
    arrays = [None if lay is None else DeviceArray(0, *lay, kind="described") for lay in layouts]
    for a, n in zip(arrays[:3], NAMES):
        require(a, n, ndim=4, contiguous=True)
    if arrays[3] is not None:
        require(arrays[3], "mask", contiguous=True)
    if arrays[4] is not None:
        require(arrays[4], "key_lengths", dtypes=("int32",), ndim=1, contiguous=True)
    device = same_device(arrays, NAMES)
    arch = device_arch(device)
    resolved = FUSED_ATTENTION.resolve(dict(zip(ATTRIBUTES, attrs)))
    dtypes = [None if a is None else a.dtype for a in arrays]
    out_dtype = output_dtype_attention(dtypes, resolved)  # the contract's attribute and mask dtype checks
    plan = plan_attention([None if a is None else a.shape for a in arrays], dtypes, resolved, arch)
    out_shape = (*arrays[0].shape[:-1], arrays[2].shape[-1])
    launch = PreparedLaunch(plan, arch, sum(a is not None for a in arrays), 1, device=device)
    return Prepared(launch, out_shape, out_dtype, device)


# torch fast path: the key (attributes, then per array its shape, contiguity, dtype and device index, or None) ->
# (the launch, O's allocation given q, the device). Contiguity stands for the strides: the checks ask for nothing else
# of them, and is_contiguous() is cheaper to read, hash and compare. Only keys whose arrays passed the checks are stored.
_torch_fast: dict = {}


def _torch_key(attrs: tuple, q, k, v, mask, key_lengths, out) -> tuple:
    # (devices as get_device()'s ints: hashed and compared ~0.3 us a call faster than torch.device objects)
    return (attrs, q.shape, q.is_contiguous(), q.dtype, q.get_device(), k.shape, k.is_contiguous(), k.dtype,
            k.get_device(), v.shape, v.is_contiguous(), v.dtype, v.get_device(),
            None if mask is None else (mask.shape, mask.is_contiguous(), mask.dtype, mask.get_device()),
            None if key_lengths is None else (key_lengths.shape, key_lengths.is_contiguous(), key_lengths.dtype,
                                              key_lengths.get_device()),
            None if out is None else (out.shape, out.is_contiguous(), out.dtype, out.get_device()))


def _torch_entry(prepared: Prepared, q, o) -> tuple:
    """What the fast path keeps of a checked call: the launch, O's cheapest allocation (torch.empty_like(q) when O
    has q's shape and dtype), the device and its raw current-stream query."""
    torch = sys.modules["torch"]
    if prepared.out_shape == tuple(q.shape) and o.dtype == q.dtype:
        allocate = torch.empty_like
    else:
        allocate = functools.partial(_empty, prepared.out_shape, o.dtype, o.device)
    return prepared.launch.launch_pointers, allocate, prepared.device, torch_stream_query()


def _empty(shape: tuple, dtype, device, q):
    return sys.modules["torch"].empty(shape, dtype=dtype, device=device)


def _torch_call(entry: tuple, q, k, v, mask, key_lengths, out, stream):
    """The call on torch tensors of a key seen before: O, the pointers, the stream, the launch."""
    launch_pointers, allocate, device, current_stream = entry
    if out is None:
        out = allocate(q)
    pointers = [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()]
    if (pointers[0] | pointers[1] | pointers[2] | pointers[3]) % 16:  # (one test for the four: ~0.1 us a call)
        for ptr, name in zip(pointers, (*NAMES[:3], "out")):
            _aligned(ptr, name)
    if mask is not None:
        pointers.insert(3, mask.data_ptr())
    if key_lengths is not None:
        pointers.insert(-1, key_lengths.data_ptr())
    launch_pointers(pointers, current_stream(device) if stream is None else stream_handle(stream))
    return out


def attention(q, k, v, *, mask=None, key_lengths=None, scale: float = 0.0, softcap: float = 0.0, causal: bool = False,
              causal_alignment: str = "top_left", layout: str = "BSHD", q_scale: float = 0.0, k_scale: float = 0.0,
              v_scale: float = 0.0, p_scale: float = 0.0, output_dtype: str = "auto", output_scale: float = 0.0,
              out=None, stream=None):
    """Scaled dot-product attention as ``trt_fusedattn::FusedAttention`` defines it (see its contract).

    q: [B, Lq, Hq, D] (BSHD) or [B, Hq, Lq, D] (BHSD); k: the same with Lkv, Hkv (Hq % Hkv == 0); v: k's with
    its own head dim Dv; float16 or bfloat16 (or all three float8_e4m3fn, with q_scale, k_scale, v_scale > 0: real
    Q = q_scale * Q), contiguous. mask: additive (the output's dtype; float16 for an FP8 output) or bool (True =
    attend), broadcastable to [B, Hq, Lq, Lkv]. key_lengths: int32 [B]. scale 0 means 1/sqrt(D); softcap > 0 caps the
    scores at softcap * tanh(scores / softcap) (Gemma-2). FP8: p_scale (0: 1/448) quantizes P for P V; output_dtype
    auto (q's dtype, float16 for FP8 q), float16, bfloat16 or float8e4m3fn (then O = e4m3(O / output_scale)).
    Returns ``out`` (q's shape with Dv last; allocated like q in the output dtype when None)."""
    # as given for the fast path's key (0 and 0.0, True and 1 are one key), normalized for the checks and the plan
    attrs = (layout, scale, softcap, causal, causal_alignment, q_scale, k_scale, v_scale, p_scale, output_dtype,
             output_scale)
    torch = sys.modules.get("torch")
    fast_key = None
    if torch is not None:
        tensor = torch.Tensor
        if (type(q) is tensor and type(k) is tensor and type(v) is tensor and (mask is None or type(mask) is tensor)
                and (key_lengths is None or type(key_lengths) is tensor) and (out is None or type(out) is tensor)):
            fast_key = _torch_key(attrs, q, k, v, mask, key_lengths, out)
            entry = _torch_fast.get(fast_key)
            if entry is not None:
                return _torch_call(entry, q, k, v, mask, key_lengths, out, stream)
    arrays = [None if x is None else device_array(x, n) for x, n in zip((q, k, v, mask, key_lengths), NAMES)]
    layouts = tuple(None if a is None else (a.shape, a.strides, a.dtype, a.device) for a in arrays)
    prepared = _prepared(layouts, (layout, float(scale), float(softcap), int(bool(causal)), causal_alignment,
                                   float(q_scale), float(k_scale), float(v_scale), float(p_scale), output_dtype,
                                   float(output_scale)))
    for a, n in zip(arrays[:3], NAMES):
        _aligned(a.ptr, n)
    q_arr = arrays[0]
    if out is None:
        o = empty_like_kind(q_arr, prepared.out_shape, prepared.out_dtype)
    else:
        o = require(device_array(out, "out"), "out", dtypes=(prepared.out_dtype,), contiguous=True)
        if tuple(o.shape) != prepared.out_shape or o.device != prepared.device:
            raise ArrayError(f"out has shape {o.shape} on cuda:{o.device}; expected {prepared.out_shape} on "
                             f"cuda:{prepared.device}")
        _aligned(o.ptr, "out")
    prepared.launch([a and a.ptr for a in arrays], [o.ptr], caller_stream(q_arr, stream))
    if fast_key is not None:  # checked torch tensors: later calls with this key take the fast path
        if len(_torch_fast) >= TORCH_FAST_ENTRIES:
            _torch_fast.clear()
        _torch_fast[fast_key] = _torch_entry(prepared, q, o.obj)
    return o.obj
