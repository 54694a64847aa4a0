"""FP8 attention sites: the scales of Q, K, V and P, from FP8 QuantizeLinear -> DequantizeLinear pairs in the model
(NVIDIA Model Optimizer's FP8 export puts them on both inputs of Q·Kᵀ and of P·V) or from calibration, and the
FP8 kernel's word on the site (its launch plan refusing it is the one-line reason it stays in its dtype).

A Q/DQ pair is peeled off an operand while the match traces it, so the fused node quantizes the float tensor
before the pair again with the pair's scale (exactly what the pair computed: e4m3 commutes with the layout
changes in between). A site with FP8 Q/DQ that cannot all be absorbed (per-channel scales, an operand or P not
quantized, P's scale below 1/448, no FP8 kernel) is left as it is, Q/DQ and all, with the reason: TensorRT runs
it; a float emulation of part of it would not be what the model computes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_fusedattn.calibration import Rotated
from trt_fusedattn.fp8 import E4M3_MAX, NUMPY_NAME
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION, MIN_P_SCALE, mask_dtype_name
from trt_fusedattn.rewrites import CannotFuse
from trt_fusedattn.rewrites._graph import is_op, producer
from trt_fusedattn.rewrites._shapes import TensorShapes
from trt_fusedattn.rewrites.attention.match import Operand
from trt_fusedattn.rewrites.conv.qdq import fp8_scale  # shared with the conv Q/DQ absorption

FP8_ARCH = "sm_90a"  # the FP8 kernel's arch, asked when no target is given
PLAN_SEQ = 128  # the sequence length the plan is asked at (lengths are int32 arguments: any would do)


@dataclass
class Fp8Scales:
    """The dequantization scales of one FP8 site (``p`` 0: 1/448) and where they came from."""

    q: float
    k: float
    v: float
    p: float = 0.0
    source: str = "Q/DQ"
    rotation: int = 0  # > 0: Q and K are rotated by fp8.qk_rotation(rotation) (their head dim) before quantization


def peel_qdq(tensor: gs.Tensor) -> tuple[gs.Tensor, float | None]:
    """``(x, scale)`` when ``tensor`` is DequantizeLinear(QuantizeLinear(x)) in float8e4m3fn with one scale;
    ``(tensor, None)`` when it is no FP8 pair (INT8 Q/DQ stays: TensorRT's); CannotFuse for an FP8 pair that
    cannot be absorbed (per-channel, different scales, saturate=0, a zero point)."""
    dq = producer(tensor)
    if not is_op(dq, "DequantizeLinear"):
        return tensor, None
    quantize = producer(dq.inputs[0])
    if not is_op(quantize, "QuantizeLinear"):
        return tensor, None
    try:
        scale = fp8_scale(quantize, None)
    except CannotFuse as reason:
        if "not float8e4m3fn" in str(reason):
            return tensor, None
        raise CannotFuse(f"FP8 Q/DQ not absorbed: {reason}") from None
    dq_scale = fp8_scale(dq, None)
    if scale[0] != dq_scale[0]:
        raise CannotFuse(f"FP8 Q/DQ not absorbed: {quantize.name} and {dq.name} have different scales")
    return quantize.inputs[0], float(scale[0])


def qdq_scales(q: float | None, k: float | None, v: float | None, p: float | None) -> Fp8Scales | None:
    """The site's scales when its Q/DQ pairs make it FP8 (None when it has none); CannotFuse when only some of
    Q, K, V and P are quantized or P's scale would saturate P = 1."""
    given = {"Q": q, "K": k, "V": v, "P (the Softmax output)": p}
    if all(s is None for s in given.values()):
        return None
    missing = [name for name, s in given.items() if s is None]
    if missing:
        raise CannotFuse(f"FP8 Q/DQ on some attention inputs but not on {', '.join(missing)}: FP8 FusedAttention "
                         f"quantizes Q, K, V and P; left to TensorRT")
    if p < MIN_P_SCALE * (1 - 2 ** -11):
        raise CannotFuse(f"P's FP8 scale {p:g} is below 1/448 (P = 1 saturates); left to TensorRT")
    return Fp8Scales(q, k, v, max(p, MIN_P_SCALE))  # 1/448 held in float16 is a hair below it


def calibrated_scales(amax: tuple[float, float, float], rotation: int = 0) -> Fp8Scales | str:
    """Per-tensor scales amax / 448 of Q, K, V (P's amax is 1 by construction: p_scale stays 1/448; Q's and K's
    amax after the ``rotation`` when there is one), or why not."""
    if not all(a > 0 for a in amax):
        return "no: Q, K or V is 0 on every calibration input (no scale to take)"
    q, k, v = (float(np.float32(a / E4M3_MAX)) for a in amax)
    return Fp8Scales(q, k, v, source="calibrated", rotation=rotation)


def rotated(op: Operand, shapes: TensorShapes) -> Rotated | None:
    """Q's or K's traced tensor as calibration rotates it (its head-dim axis and head dim), or None where the head
    dim is not known statically or not a power of two."""
    tensor = op.any()
    axis = -2 if tensor is op.kt or tensor is op.folded_kt else -1
    size = shapes.dim(tensor, axis)
    dim = size // op.heads if size and tensor is op.flat and op.heads else size
    return Rotated(tensor.name, axis, dim) if dim and not dim & (dim - 1) else None


def plan_problem(heads: tuple, dims: tuple, mask: str | None, key_lengths: bool, attrs: dict, arch: str) -> str:
    """Why the FP8 kernel does not take a site (its launch plan's one-line error), or "" when it does. Asked in
    BHSD at batch 1 and length ``PLAN_SEQ`` (lengths reach the kernel as arguments); unknown head counts as 1."""
    from trt_fusedattn.plugins.attention.plan import plan_attention

    hq, hkv = heads[0] or heads[1] or 1, heads[1] or heads[0] or 1
    dqk, dv = dims
    shapes = [(1, hq, PLAN_SEQ, dqk), (1, hkv, PLAN_SEQ, dqk), (1, hkv, PLAN_SEQ, dv),
              (1, 1, PLAN_SEQ, PLAN_SEQ) if mask else None, (1,) if key_lengths else None]
    resolved = FUSED_ATTENTION.resolve({**attrs, "layout": "BHSD"})
    dtypes = [NUMPY_NAME] * 3 + [None if mask is None else "bool" if mask == "bool" else
                                 mask_dtype_name(NUMPY_NAME, resolved), "int32" if key_lengths else None]
    try:
        plan_attention(shapes, dtypes, resolved, arch)
    except (ValueError, KeyError) as err:
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    return ""


def fp8_attributes(scales: Fp8Scales, float_dtype: np.dtype | None) -> dict:
    """The FP8 attributes of a node whose readers take ``float_dtype``: the scales, and a bfloat16 output for
    bfloat16 models (float16, the default, for float16 and float32 ones: a float32 reader gets a Cast)."""
    attrs = {"q_scale": scales.q, "k_scale": scales.k, "v_scale": scales.v}
    if scales.p:
        attrs["p_scale"] = scales.p
    if float_dtype is not None and float_dtype.name == "bfloat16":
        attrs["output_dtype"] = "bfloat16"
    return attrs


def describe(scales: Fp8Scales) -> str:
    """What the report shows of an FP8 site."""
    p = f"{scales.p:.4g}" if scales.p else "1/448"
    rotation = f" Q/K rotated (Hadamard {scales.rotation})" if scales.rotation else ""
    return (f"{scales.source} q_scale={scales.q:.4g} k_scale={scales.k:.4g} v_scale={scales.v:.4g} p_scale={p}"
            f"{rotation}")
