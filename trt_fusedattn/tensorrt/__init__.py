"""The TensorRT layer: our ops registered as AOT plugins, engines built from fused ONNX models, and run.

``available()`` says whether TensorRT's builder can be used here, and if not, why and how to fix it.
"""
from __future__ import annotations

import functools

INSTALL_HINT = "pip install 'tensorrt>=10.8' (NVIDIA's full wheel, with the builder libraries)"


class TensorRTUnavailable(RuntimeError):
    """TensorRT (or the part of it a step needs) is not installed; the message says what and how to install."""


@functools.lru_cache(maxsize=None)
def available() -> tuple[bool, str]:
    """(True, version) when TensorRT's builder and AOT Python plugins work here, else (False, one-line reason)."""
    try:
        import tensorrt as trt
    except Exception as exc:  # ImportError, or a missing libnvinfer behind the bindings
        return False, f"TensorRT is not installed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); {INSTALL_HINT}"
    if not hasattr(trt, "IPluginV3QuickAOTBuild"):
        return False, (f"TensorRT {getattr(trt, '__version__', '?')} has no AOT Python plugins "
                       f"(IPluginV3QuickAOTBuild, TensorRT >= 10.8 needed); {INSTALL_HINT}")
    try:
        builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    except Exception as exc:
        builder, reason = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    else:
        reason = "Builder() returned None"
    if builder is None:
        return False, f"TensorRT {trt.__version__} cannot create a builder ({reason}); {INSTALL_HINT}"
    return True, f"TensorRT {trt.__version__}"


def require_tensorrt() -> None:
    """Raise TensorRTUnavailable with the reason when the builder cannot be used."""
    ok, reason = available()
    if not ok:
        raise TensorRTUnavailable(reason)
