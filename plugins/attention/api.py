"""``attention(q, k, v, ...)``: the FusedAttention kernel on the caller's device arrays (torch, CuPy, pycuda,
``__cuda_array_interface__`` or DLPack), on the caller's stream, returning an output of the same kind.

It launches exactly the PTX and launch plan a TensorRT engine would (``plan_attention``). The checks, the plan and
the loaded kernel with its converted arguments are cached per (shapes, strides, dtypes, devices, attributes), so a
repeated call does only the pointer bookkeeping and the launch (NOTES.md: host overhead)."""
from __future__ import annotations

import functools

from trt_fusedattn.launcher import (ArrayError, DeviceArray, caller_stream, device_arch, device_array, empty_like_kind,
                                    require, same_device)
from trt_fusedattn.launcher.launch import PreparedLaunch
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.plan import plan_attention

NAMES = ("q", "k", "v", "mask", "key_lengths")


def _aligned(array, name: str) -> None:
    if array.ptr % 16:
        raise ArrayError(f"{name} starts at 0x{array.ptr:x}, not 16-byte aligned; pass an array that owns its "
                         "memory (e.g. .contiguous() of a fresh tensor)")


@functools.lru_cache(maxsize=1024)
def _prepared(layouts: tuple, attrs: tuple) -> tuple:
    """(the prepared kernel launch, O's shape, its device) for arrays of these (shape, strides, dtype, device) (None
    when absent) and attributes; raises the one-line errors of the checks and the plan."""
    arrays = [None if lay is None else DeviceArray(0, *lay, kind="described") for lay in layouts]
    for a, n in zip(arrays[:3], NAMES):
        require(a, n, ndim=4, contiguous=True)
    if arrays[3] is not None:
        require(arrays[3], "mask", contiguous=True)
    if arrays[4] is not None:
        require(arrays[4], "key_lengths", dtypes=("int32",), ndim=1, contiguous=True)
    device = same_device(arrays, NAMES)
    arch = device_arch(device)
    layout, scale, softcap, causal, alignment = attrs
    resolved = FUSED_ATTENTION.resolve({"layout": layout, "scale": scale, "softcap": softcap, "causal": causal,
                                        "causal_alignment": alignment})
    plan = plan_attention([None if a is None else a.shape for a in arrays],
                          [None if a is None else a.dtype for a in arrays], resolved, arch)
    out_shape = (*arrays[0].shape[:-1], arrays[2].shape[-1])
    return PreparedLaunch(plan, arch, sum(a is not None for a in arrays), 1, device=device), out_shape, device


def attention(q, k, v, *, mask=None, key_lengths=None, scale: float = 0.0, softcap: float = 0.0, causal: bool = False,
              causal_alignment: str = "top_left", layout: str = "BSHD", out=None, stream=None):
    """Scaled dot-product attention as ``trt_fusedattn::FusedAttention`` defines it (see its contract).

    q: [B, Lq, Hq, D] (BSHD) or [B, Hq, Lq, D] (BHSD); k: the same with Lkv, Hkv (Hq % Hkv == 0); v: k's with
    its own head dim Dv; float16 or bfloat16, contiguous. mask: additive (q's dtype) or bool (True = attend),
    broadcastable to [B, Hq, Lq, Lkv]. key_lengths: int32 [B]. scale 0 means 1/sqrt(D); softcap > 0 caps the
    scores at softcap * tanh(scores / softcap) (Gemma-2). Returns ``out`` (q's shape with Dv last; allocated like q
    when None)."""
    arrays = [None if x is None else device_array(x, n) for x, n in zip((q, k, v, mask, key_lengths), NAMES)]
    layouts = tuple(None if a is None else (a.shape, a.strides, a.dtype, a.device) for a in arrays)
    prepared, out_shape, device = _prepared(layouts, (layout, float(scale), float(softcap), int(bool(causal)),
                                                      causal_alignment))
    for a, n in zip(arrays[:3], NAMES):
        _aligned(a, n)
    q_arr = arrays[0]
    if out is None:
        o = empty_like_kind(q_arr, out_shape, q_arr.dtype)
    else:
        o = require(device_array(out, "out"), "out", dtypes=(q_arr.dtype,), contiguous=True)
        if tuple(o.shape) != out_shape or o.device != device:
            raise ArrayError(f"out has shape {o.shape} on cuda:{o.device}; expected {out_shape} on cuda:{device}")
        _aligned(o, "out")
    prepared([a and a.ptr for a in arrays], [o.ptr], caller_stream(q_arr, stream))
    return o.obj
