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
