"""A stand-in for the compiled part of TensorRT's Python bindings (``tensorrt.so``), under NVIDIA's own
``tensorrt.plugin`` Python sources.

It holds only what ``tensorrt.plugin`` and our layer touch: enums with TensorRT's member names, plugin fields
and their collection, the plugin registry, the plugin base classes (empty, as the pybind trampolines are to
Python), dimension expressions and their builder, tensor descriptors. It builds nothing; ``builder.py`` drives
the plugins through it the way the ONNX parser and the builder do. Where a rule of TensorRT's comes in, the
comment names its source.
"""
from __future__ import annotations

import enum
import types

import numpy as np


def _enum(name: str, members) -> type:
    return enum.IntEnum(name, [(m, i) for i, m in enumerate(members)])


# Member names as in the bindings (tensorrt.DataType, TensorFormat, ...); values are arbitrary here.
DataType = _enum("DataType", ["FLOAT", "HALF", "INT8", "INT32", "BOOL", "UINT8", "FP8", "BF16", "INT64", "INT4",
                              "FP4", "E8M0"])
TensorFormat = _enum("TensorFormat", ["LINEAR", "CHW2", "HWC8", "CHW4", "CHW16", "CHW32", "DHWC8", "CDHW32", "HWC",
                                      "DLA_LINEAR", "DLA_HWC4", "HWC16", "DHWC"])
PluginFieldType = _enum("PluginFieldType", ["FLOAT16", "FLOAT32", "FLOAT64", "INT8", "INT16", "INT32", "CHAR",
                                            "DIMS", "UNKNOWN", "BF16", "INT64", "FP8", "INT4", "FP4"])
DimensionOperation = _enum("DimensionOperation", ["SUM", "PROD", "MAX", "MIN", "SUB", "EQUAL", "LESS", "FLOOR_DIV",
                                                  "CEIL_DIV"])
TensorRTPhase = _enum("TensorRTPhase", ["BUILD", "RUNTIME"])
QuickPluginCreationRequest = _enum("QuickPluginCreationRequest", ["UNKNOWN", "PREFER_JIT", "PREFER_AOT",
                                                                  "STRICT_JIT", "STRICT_AOT"])
PluginArgType = _enum("PluginArgType", ["INT"])
PluginArgDataType = _enum("PluginArgDataType", ["INT8", "INT16", "INT32"])
float32, float16, bfloat16, int8, int32, int64, uint8, fp8 = (DataType.FLOAT, DataType.HALF, DataType.BF16,
                                                               DataType.INT8, DataType.INT32, DataType.INT64,
                                                               DataType.UINT8, DataType.FP8)

# The field types' numpy element types: what a PluginField's ``data`` holds (pybind's buffer of the field).
FIELD_NUMPY = {PluginFieldType.FLOAT16: np.float16, PluginFieldType.FLOAT32: np.float32,
               PluginFieldType.FLOAT64: np.float64, PluginFieldType.INT8: np.int8, PluginFieldType.INT16: np.int16,
               PluginFieldType.INT32: np.int32, PluginFieldType.INT64: np.int64, PluginFieldType.CHAR: np.int8,
               PluginFieldType.UNKNOWN: np.uint8}


def nptype(trt_type):
    mapping = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT8: np.int8,
               DataType.INT32: np.int32, DataType.INT64: np.int64, DataType.BOOL: np.bool_,
               DataType.UINT8: np.uint8}
    if trt_type in mapping:
        return mapping[trt_type]
    raise TypeError("Could not resolve TensorRT datatype to an equivalent numpy datatype.")


class Logger:
    """Records what the plugin library logs (it warns once that it is experimental)."""

    Severity = _enum("Severity", ["INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE"])
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = Severity

    def __init__(self, min_severity=None):
        self.messages = []

    def log(self, severity, msg):
        self.messages.append((severity, msg))


ILogger = Logger


class PluginField:
    """name, data (a numpy array of the field type's element type), type, size."""

    def __init__(self, name="", data=None, type=PluginFieldType.UNKNOWN):  # noqa: A002 - the bindings' keyword
        self.name, self.type = name, type
        if isinstance(data, (bytes, bytearray)):
            array = np.frombuffer(bytes(data), dtype=FIELD_NUMPY[type])
        else:
            array = np.asarray([] if data is None else data, dtype=FIELD_NUMPY[type]).reshape(-1)
        self.data, self.size = array, array.size


class PluginFieldCollection(list):
    """A list of PluginFields (the bindings accept a list and iterate it)."""


class _Registry:
    """``get_plugin_registry()``: creators by (name, version, namespace)."""

    def __init__(self):
        self.creators = {}

    def register_creator(self, creator, namespace=""):
        key = (creator.name, creator.plugin_version, namespace)
        if key in self.creators:
            return False
        self.creators[key] = creator
        return True

    def get_creator(self, name, version, namespace=""):
        return self.creators.get((name, version, namespace))


class IDimensionExpr:
    """A dimension expression: a constant, a named run-time dimension, or an operation on two expressions."""

    def __init__(self, op=None, args=(), value=None, name=None):
        self.op, self.args, self.value, self.name = op, tuple(args), value, name

    def is_constant(self):
        return self.value is not None

    def get_constant_value(self):
        if self.value is None:
            raise RuntimeError(f"{self} is not a build-time constant")
        return self.value

    def evaluate(self, env: dict) -> int:
        """The value at run time, given every named dimension's value."""
        if self.value is not None:
            return self.value
        if self.name is not None:
            return env[self.name]
        a, b = (x.evaluate(env) for x in self.args)
        return _apply(self.op, a, b)

    def __repr__(self):
        if self.value is not None:
            return str(self.value)
        if self.name is not None:
            return self.name
        return f"{self.op.name}({self.args[0]!r}, {self.args[1]!r})"


def _apply(op, a: int, b: int) -> int:
    if op in (DimensionOperation.FLOOR_DIV, DimensionOperation.CEIL_DIV) and b == 0:
        raise ZeroDivisionError("dimension expression divides by zero")
    return {DimensionOperation.SUM: lambda: a + b, DimensionOperation.PROD: lambda: a * b,
            DimensionOperation.MAX: lambda: max(a, b), DimensionOperation.MIN: lambda: min(a, b),
            DimensionOperation.SUB: lambda: a - b, DimensionOperation.EQUAL: lambda: int(a == b),
            DimensionOperation.LESS: lambda: int(a < b), DimensionOperation.FLOOR_DIV: lambda: a // b,
            DimensionOperation.CEIL_DIV: lambda: -(-a // b)}[op]()


class IExprBuilder:
    """``constant`` and ``operation`` as TensorRT's IExprBuilder; two constants fold to a constant (TensorRT
    folds them too: a static dimension stays ``is_constant()``)."""

    def constant(self, value):
        return IDimensionExpr(value=int(value))

    def operation(self, op, first, second):
        if first.is_constant() and second.is_constant():
            return IDimensionExpr(value=_apply(op, first.value, second.value))
        return IDimensionExpr(op, (first, second))

    def declare_size_tensor(self, index, opt, upper):
        raise NotImplementedError("size tensors are not used by our plugins")


class DimsExprs(list):
    def __init__(self, n=0):
        super().__init__([None] * n)


class Dims(tuple):
    MAX_DIMS = 8


class PluginTensorDesc:
    def __init__(self):
        self.dims, self.type, self.format, self.scale = Dims(), DataType.FLOAT, TensorFormat.LINEAR, 1.0


class DynamicPluginTensorDesc:
    def __init__(self, desc=None, min=(), opt=(), max=()):  # noqa: A002 - the bindings' names
        self.desc = desc or PluginTensorDesc()
        self.min, self.opt, self.max = Dims(min), Dims(opt), Dims(max)


class ISymExpr:
    def __init__(self):
        self.type, self.dtype, self.expr = None, None, None


class KernelLaunchParams:
    """The C++ side of ``get_launch_params``: grid, block, shared memory as symbolic expressions."""

    def __init__(self):
        self.grid_x = self.grid_y = self.grid_z = self.block_x = self.block_y = self.block_z = None
        self.shared_mem = None


class SymExprSetter(list):
    """The C++ side of ``get_launch_params``'s extra arguments."""

    def __init__(self):
        super().__init__()
        self.nbSymExprs = 0

    def __setitem__(self, index, value):
        while len(self) <= index:
            self.append(None)
        super().__setitem__(index, value)


class _Interface:
    """Base of the plugin interfaces: in the bindings these are pybind trampolines with nothing to initialise."""

    def __init__(self, *args, **kwargs):
        pass


IPluginV3 = type("IPluginV3", (_Interface,), {})
IPluginV3QuickCore = type("IPluginV3QuickCore", (_Interface,), {})
IPluginV3QuickBuild = type("IPluginV3QuickBuild", (_Interface,), {})
IPluginV3QuickRuntime = type("IPluginV3QuickRuntime", (_Interface,), {})
IPluginV3QuickAOTBuild = type("IPluginV3QuickAOTBuild", (_Interface,), {})
IPluginCreatorV3Quick = type("IPluginCreatorV3Quick", (_Interface,), {})
ITensor = type("ITensor", (), {})


class NetworkDefinitionCreationFlag(enum.IntEnum):
    """The 10.x members (11.x networks are always strongly typed; the flag stays for compatibility)."""

    STRONGLY_TYPED = 1
    PREFER_JIT_PYTHON_PLUGINS = 2
    PREFER_AOT_PYTHON_PLUGINS = 3


def make_module(version: str) -> types.ModuleType:
    """A fresh ``tensorrt`` module (its own plugin registry) reporting ``version``."""
    module = types.ModuleType("tensorrt")
    module.__dict__.update({k: v for k, v in globals().items() if not k.startswith("__") and k != "make_module"})
    module.__version__ = version
    module.bool = DataType.BOOL  # tensorrt.bool, as the bindings name it
    registry = _Registry()
    module.get_plugin_registry = lambda: registry
    return module
