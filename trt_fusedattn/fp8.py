"""E4M3 (ONNX float8e4m3fn) rounding, written once for the op contracts' numpy references, calibration and the Q/DQ
absorption: saturating round-to-nearest-even, as the kernels' ``cvt.rn.satfinite.e4m3x2`` and ONNX's
QuantizeLinear (saturate=1) do."""
from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0  # E4M3's largest finite value
ONNX_NAME = "float8e4m3fn"  # the ONNX spelling (TensorProto.FLOAT8E4M3FN, attribute values)
NUMPY_NAME = "float8_e4m3fn"  # ml_dtypes' / numpy's spelling (dtype names, torch.float8_e4m3fn)


def to_e4m3(x, scale: float = 1.0) -> np.ndarray:
    """``e4m3(x / scale)`` (nearest even, saturating at +-448; NaN stays NaN) as an ml_dtypes float8_e4m3fn array."""
    import ml_dtypes

    return np.clip(np.asarray(x, np.float64) / scale, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)


def quantize_e4m3(x, scale: float) -> np.ndarray:
    """``scale * e4m3(x / scale)`` in float64: what a kernel that quantizes ``x`` with ``scale`` sees of it."""
    return to_e4m3(x, scale).astype(np.float64) * scale


def is_e4m3(dtype) -> bool:
    """Whether a dtype (numpy dtype, ml_dtypes type or name in either spelling) is float8e4m3fn."""
    if dtype is None:
        return False
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return name in (ONNX_NAME, NUMPY_NAME)


def numpy_dtype(name: str) -> np.dtype:
    """A dtype name as a numpy dtype, ml_dtypes' own included (``bfloat16``, ``float8_e4m3fn``)."""
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name, name))


def qk_rotation(dim: int) -> tuple[np.ndarray, float]:
    """``(R, c)``: a ``dim`` x ``dim`` Hadamard matrix with fixed random column signs, scaled by a power of two so
    every entry is exact in any float dtype, with R Rᵀ = c·I (c 1 or 2). Q and K rotated by it before FP8
    quantization (FlashAttention-3's incoherent processing) spread an outlier channel over all of them, and
    (Q R)(K R)ᵀ = c·Q Kᵀ: the attention scale divided by c undoes the rotation exactly. ``dim`` a power of two."""
    if dim < 1 or dim & (dim - 1):
        raise ValueError(f"the Q/K rotation needs a power-of-two head dim, got {dim}")
    h = np.ones((1, 1))
    while h.shape[0] < dim:
        h = np.block([[h, h], [h, -h]])
    signs = np.random.default_rng(dim).choice([-1.0, 1.0], dim)
    norm = 2.0 ** (int(np.log2(dim)) // 2)
    return h * signs / norm, dim / norm ** 2


def rotate_heads(x, dim: int) -> np.ndarray:
    """``x`` (float64) with its last axis, heads x ``dim``, rotated head by head by ``qk_rotation(dim)``: what a
    rotated Q or K holds, and a projection's weight or bias with the rotation folded in; the shape of ``x``."""
    x = np.asarray(x, np.float64)
    return (x.reshape(*x.shape[:-1], -1, dim) @ qk_rotation(dim)[0]).reshape(x.shape)
