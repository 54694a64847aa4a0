"""The TensorRT layer: our ops registered as AOT plugins, engines built from fused ONNX models, and run.

    available() -> (bool, reason)          # can TensorRT's builder be used here? if not, why and how to fix it
    register_plugins()                     # every op record (plugins.OPS) as an AOT plugin (plugins.py)
    prepare_model(model, precision)        # the ONNX the parser sees: present inputs, 1-D convs, casts (prepare.py)
    build_engine(onnx_path, engine_path, precision="fp16", shapes=..., timing_cache=...)   (build.py)
    parse_shapes(["ids:1x8/4x128/8x512"])  # the CLI's --shapes form -> build_engine's shapes   (build.py)
    Engine(engine_path)(inputs) -> {name: array}   # torch / CuPy arrays, or numpy (copied)  (runtime.py)
"""
from __future__ import annotations

import functools

from trt_fusedattn.errors import TensorRTUnavailable, first_line

PRECISIONS = ("fp16", "bf16", "fp8", "fp32")  # what build_engine's precision (fuse-onnx --fp16 ...) may name
# Attributes prepare_model adds to our nodes: which contract inputs the node still lists (bit i = input i; the parser
# passes an empty input as a null tensor, which addPluginV3 rejects), and the namespace the parser finds the creator in.
PRESENT_INPUTS = "present_inputs"
PLUGIN_NAMESPACE = "plugin_namespace"
# TensorRT's channels-last format for a tensor of each dtype and the channel multiple it pads to (the I/O format
# table of TensorRT's developer guide: HWC8 is bound to FP16/BF16, HWC16 to FP16/INT8/FP8).
CHANNELS_LAST_FORMATS = {"float16": ("HWC8", 8), "bfloat16": ("HWC8", 8), "float8_e4m3fn": ("HWC16", 16)}
MIN_VERSION = (10, 9)  # AOT Python plugins and the ONNX parser's AOT plugin support (TensorRT 10.9 release notes)
INSTALL_HINT = ("pip install 'tensorrt>=10.9' (NVIDIA's full wheel, with the builder libraries; its AOT plugins "
                "also need nvcc and cuda-python: pip install 'trt_fusedattn[tensorrt]')")


def _first_line(exc: Exception) -> str:
    """The exception's type and the start of its first line (TensorRT's import errors run long)."""
    return f"{type(exc).__name__}: {first_line(exc)[:120]}"


@functools.lru_cache(maxsize=None)
def available() -> tuple[bool, str]:
    """(True, version) when TensorRT's builder and AOT Python plugins work here, else (False, one-line reason)."""
    try:
        import tensorrt as trt
    except Exception as exc:  # ImportError, or a missing libnvinfer behind the bindings
        return False, f"TensorRT is not installed ({_first_line(exc)}); {INSTALL_HINT}"
    version = getattr(trt, "__version__", "?")
    numbers = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if not hasattr(trt, "IPluginV3QuickAOTBuild") or numbers < MIN_VERSION:
        return False, (f"TensorRT {version} cannot build engines with AOT Python plugins (TensorRT >= 10.9); "
                       f"{INSTALL_HINT}")
    try:
        builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
        reason = "Builder() returned None"
    except Exception as exc:
        builder, reason = None, _first_line(exc)
    if builder is None:
        return False, f"TensorRT {version} cannot create a builder ({reason}); {INSTALL_HINT}"
    return True, f"TensorRT {version}"


def require_tensorrt() -> None:
    """Raise TensorRTUnavailable (one line: what is missing, how to install) when the builder cannot be used."""
    ok, reason = available()
    if not ok:
        raise TensorRTUnavailable(reason)


def __getattr__(name):
    lazy = {"build_engine": "build", "EngineBuildError": "build", "parse_shapes": "build",
            "register_plugins": "plugins", "prepare_model": "prepare", "Engine": "runtime"}
    if name in lazy:
        import importlib
        return getattr(importlib.import_module(f"trt_fusedattn.tensorrt.{lazy[name]}"), name)
    raise AttributeError(f"module 'trt_fusedattn.tensorrt' has no attribute {name!r}")
