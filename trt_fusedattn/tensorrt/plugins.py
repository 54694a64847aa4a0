"""Our ops as TensorRT AOT Python plugins (``tensorrt.plugin``), generated from each op's contract and plan.

``register_plugins()`` registers ``trt_fusedattn::FusedAttention`` and ``trt_fusedattn::FusedConv`` with

- ``@trtp.register``: output shape from ``output_shape_<op>(input_shapes, attrs)`` (FusedAttention: Q's shape, as its
  contract says, unless its plan module defines one), output dtype = input 0's;
- ``@trtp.autotune``: FP16 and BF16 for the op's main tensors (others keep the network's dtype), LINEAR formats,
  except tensors the op reads channels-last (FusedConv's X, residual, Y: ``HWC8``, rank 4 only);
- ``@trtp.aot_impl``: ``plan_<op>(input_shapes, input_dtypes, attrs, arch[, formats=])`` evaluated on TensorRT's
  symbolic shapes (``symbolic.py``), the plan's source compiled to PTX for the building GPU (launcher's cache),
  returned as (kernel name, PTX, KernelLaunchParams(grid, block, shared memory), int32 extra args).

The plan function's contract is in ``trt_fusedattn/launcher/plan.py``. Each plan function is called as::

    plan_<op>(input_shapes: list[tuple | None], input_dtypes: list[str | None], attrs: dict, arch: str
              [, formats=(format name per contract input or None, ..., output format name)]) -> LaunchPlan

with one entry per contract input (None for a missing optional input), dims that are ints when TensorRT knows them
at build time (static in the model) and ``SymbolicDim`` otherwise, attrs resolved by the contract (defaults
filled), arch like ``"sm_90a"``. ``formats`` is passed only to a plan function that declares that keyword.

The ONNX parser gives a plugin only the node's attributes that are present, and for a missing optional input in
the middle a null tensor; ``prepare_model`` (called by ``build_engine``) therefore drops empty inputs and records
which contract inputs are present in the int attribute ``present_inputs`` (bit i = contract input i), and adds
``plugin_namespace`` for parsers that do not look the plugin up by the node's domain.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from numpy import typing as npt

from trt_fusedattn.contract import DOMAIN, OpContract
from trt_fusedattn.launcher.compile import compile_ptx
from trt_fusedattn.tensorrt.symbolic import plan_shape, trt_value

PRESENT_INPUTS = "present_inputs"
_ATTR_KEY = "_trt_fusedattn_attrs"  # resolved attributes carried on the output TensorDesc to autotune and aot_impl
_DTYPE_NAMES = {"HALF": "float16", "BF16": "bfloat16", "FLOAT": "float32", "INT32": "int32", "INT64": "int64",
                "INT8": "int8", "BOOL": "bool", "FP8": "float8_e4m3fn", "UINT8": "uint8"}
_AUTOTUNE_TYPE = {"HALF": "FP16", "FLOAT": "FP32"}  # AutoTuneCombination's spelling of a trt.DataType name
MAIN_TYPES = ("FP16", "BF16")


@dataclass(frozen=True)
class PluginBinding:
    """What TensorRT needs of one op beyond its contract: where its plan lives and how its tensors are typed/laid out."""

    contract: OpContract
    plan_module: str                     # module holding plan_<op> and output_shape_<op>
    op: str                              # the <op> of those names
    main_inputs: tuple                   # inputs that take the kernel's element type (FP16/BF16) with the output
    channels_last: tuple = ()            # tensors (inputs and output names) read/written as HWC8 when rank 4
    output_like_input0: bool = False     # the contract gives the output input 0's shape (no output_shape_<op>)

    @functools.cached_property
    def plan(self) -> Callable:
        import importlib
        return getattr(importlib.import_module(self.plan_module), f"plan_{self.op}")

    @functools.cached_property
    def output_shape(self) -> Callable:
        import importlib
        module = importlib.import_module(self.plan_module)
        if self.output_like_input0 and not hasattr(module, f"output_shape_{self.op}"):
            return lambda input_shapes, attrs: input_shapes[0]
        if not hasattr(module, f"output_shape_{self.op}"):
            raise NotImplementedError(f"{self.plan_module} has no output_shape_{self.op}(input_shapes, attrs); "
                                      "TensorRT needs it to infer the output shape")
        return getattr(module, f"output_shape_{self.op}")


def bindings() -> tuple[PluginBinding, ...]:
    from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
    from trt_fusedattn.plugins.conv.contract import FUSED_CONV
    return (
        PluginBinding(FUSED_ATTENTION, "trt_fusedattn.plugins.attention.plan", "attention",
                      main_inputs=("Q", "K", "V", "mask"), output_like_input0=True),
        PluginBinding(FUSED_CONV, "trt_fusedattn.plugins.conv.plan", "conv",
                      main_inputs=("X", "W", "residual"), channels_last=("X", "residual", "Y")),
    )


# ---------------------------------------------------------------- the ONNX handed to TensorRT

def prepare_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose custom nodes the ONNX parser can map to our plugins (see the module docstring)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for node in model.graph.node:
        if node.domain != DOMAIN:
            continue
        present = [i for i, name in enumerate(node.input) if name]
        names = [node.input[i] for i in present]
        del node.input[:]
        node.input.extend(names)
        for attr in [a for a in node.attribute if a.name in (PRESENT_INPUTS, "plugin_namespace")]:
            node.attribute.remove(attr)
        node.attribute.extend([onnx.helper.make_attribute(PRESENT_INPUTS, sum(1 << i for i in present)),
                               onnx.helper.make_attribute("plugin_namespace", DOMAIN)])
    return model


# ---------------------------------------------------------------- plugin functions

def _attr_annotation(kind: str):
    return {"int": int, "float": float, "string": str, "ints": npt.NDArray[np.int32]}[kind]


def _canonical_attr(value):
    """A plugin field as the contract takes it (strings lose the parser's trailing NUL, arrays become tuples)."""
    if isinstance(value, str):
        return value.rstrip("\0")
    if isinstance(value, np.ndarray):
        return tuple(int(v) for v in value)
    return value


def _input_names(binding: PluginBinding, n_given: int, present_mask: int | None) -> list[str]:
    """The contract names of the tensors TensorRT passes, in order."""
    names = [t.name for t in binding.contract.inputs]
    if present_mask is None:
        present_mask = (1 << n_given) - 1
    chosen = [names[i] for i in range(len(names)) if present_mask >> i & 1]
    if len(chosen) != n_given:
        raise ValueError(f"{binding.contract.qualified_name}: {n_given} inputs given but present_inputs="
                         f"{present_mask:#b} names {chosen}")
    return chosen


def _signature(binding: PluginBinding, *, attrs: bool, tail: tuple, returns) -> inspect.Signature:
    """The signature tensorrt.plugin validates: every contract input as a TensorDesc, then (optionally) every
    attribute, then ``tail`` (``outputs``, ``tactic``)."""
    import tensorrt.plugin as trtp
    P = inspect.Parameter
    params = [P(t.name, P.POSITIONAL_OR_KEYWORD, annotation=trtp.TensorDesc) for t in binding.contract.inputs]
    if attrs:
        params += [P(a.name, P.POSITIONAL_OR_KEYWORD, annotation=_attr_annotation(a.kind))
                   for a in binding.contract.attributes]
        params.append(P(PRESENT_INPUTS, P.POSITIONAL_OR_KEYWORD, annotation=int))
    params += [P(name, P.POSITIONAL_OR_KEYWORD, annotation=annotation) for name, annotation in tail]
    return inspect.Signature(params, return_annotation=returns)


def _split_call(args: tuple):
    """(input TensorDescs, outputs, tactic) of a call TensorRT makes as (*inputs, *attr values, outputs, tactic)."""
    import tensorrt.plugin as trtp
    inputs = []
    for a in args:
        if not isinstance(a, trtp.TensorDesc):
            break
        inputs.append(a)
    return inputs, args[-2], args[-1]


def _io_by_name(binding: PluginBinding, descs: list, outputs) -> tuple[dict, list[str]]:
    attrs = getattr(outputs[0], _ATTR_KEY)
    names = _input_names(binding, len(descs), attrs[PRESENT_INPUTS])
    return dict(zip(names, descs)), names


def make_register(binding: PluginBinding):
    """The ``@trtp.register`` function: resolves the attributes (defaults for absent ones), infers the output."""
    import tensorrt.plugin as trtp

    def register(*descs, **fields):
        present = fields.pop(PRESENT_INPUTS, None)
        attrs = binding.contract.resolve({k: _canonical_attr(v) for k, v in fields.items()})
        names = _input_names(binding, len(descs), present)
        q = descs[0]
        if any(getattr(e, "is_fake", False) for e in q.shape_expr):  # the data-type pass: shapes are placeholders
            out = q.like()
        else:
            by_name = dict(zip(names, descs))
            shapes = [plan_shape(by_name[t.name].shape_expr) if t.name in by_name else None
                      for t in binding.contract.inputs]
            shape = binding.output_shape(shapes, attrs)
            out = trtp.from_shape_expr(tuple(trt_value(d) for d in shape), dtype=q.dtype)
        object.__setattr__(out, _ATTR_KEY, {**attrs, PRESENT_INPUTS: present})
        return out

    register.__signature__ = _signature(binding, attrs=True, tail=(), returns=trtp.TensorDesc)
    register.__name__ = f"register_{binding.op}"
    return register


def _type_name(dtype) -> str:
    return _AUTOTUNE_TYPE.get(dtype.name, dtype.name)


def make_autotune(binding: PluginBinding):
    """The ``@trtp.autotune`` function: one type/format combination per main element type (FP16, BF16)."""
    import tensorrt.plugin as trtp

    def autotune(*args):
        descs, outputs = list(args[:-1]), args[-1]
        by_name, names = _io_by_name(binding, descs, outputs)
        output_name = binding.contract.outputs[0].name
        combos = []
        for main in MAIN_TYPES:
            types, formats = [], []
            for name, desc in [(n, by_name[n]) for n in names] + [(output_name, outputs[0])]:
                follows = name == output_name or (name in binding.main_inputs
                                                  and desc.dtype.name in ("HALF", "BF16", "FLOAT"))
                types.append(main if follows else _type_name(desc.dtype))
                formats.append("HWC8" if name in binding.channels_last and len(desc.shape_expr) == 4 else "LINEAR")
            combos.append(trtp.AutoTuneCombination(", ".join(types), ", ".join(formats)))
        return combos

    sig = _signature(binding, attrs=False, tail=(("outputs", tuple[trtp.TensorDesc]),), returns=None)
    autotune.__signature__ = sig.replace(return_annotation=list[trtp.AutoTuneCombination])
    return autotune


def _building_arch() -> str:
    """The arch of the GPU TensorRT is building on (the current context's device)."""
    from trt_fusedattn.launcher.launch import device_arch, driver
    drv = driver()
    err, device = drv.cuCtxGetDevice()
    return device_arch(int(device) if err == drv.CUresult.CUDA_SUCCESS else 0)


def _takes_formats(plan: Callable) -> bool:
    return "formats" in inspect.signature(plan).parameters


def make_aot_impl(binding: PluginBinding):
    """The ``@trtp.aot_impl`` function: the op's plan on TensorRT's shapes, compiled to PTX for this GPU."""
    import tensorrt.plugin as trtp

    def aot_impl(*args):
        descs, outputs, _tactic = _split_call(args)
        by_name, _ = _io_by_name(binding, descs, outputs)
        attrs = {k: v for k, v in getattr(outputs[0], _ATTR_KEY).items() if k != PRESENT_INPUTS}
        specs = binding.contract.inputs
        shapes = [plan_shape(by_name[t.name].shape_expr) if t.name in by_name else None for t in specs]
        dtypes = [_DTYPE_NAMES.get(by_name[t.name].dtype.name, by_name[t.name].dtype.name) if t.name in by_name
                  else None for t in specs]
        formats = tuple(by_name[t.name].format.name if t.name in by_name else None for t in specs)
        formats += (outputs[0].format.name,)
        extra = {"formats": formats} if _takes_formats(binding.plan) else {}
        if not extra and any(f not in (None, "LINEAR") for f in formats):
            raise ValueError(f"{binding.contract.qualified_name}: TensorRT chose formats {formats} but "
                             f"plan_{binding.op} takes no formats= keyword to adapt to them")
        arch = _building_arch()
        plan = binding.plan(shapes, dtypes, attrs, arch, **extra)
        ptx = compile_ptx(plan.source, arch, plan.defines)
        grid = (tuple(plan.grid) + (1, 1))[:3]
        block = (tuple(plan.block) + (1, 1))[:3]
        params = trtp.KernelLaunchParams()
        params.grid_x, params.grid_y, params.grid_z = (trt_value(g) for g in grid)
        params.block_x, params.block_y, params.block_z = (trt_value(b) for b in block)
        params.shared_mem = trt_value(plan.shared_mem)
        extra_args = trtp.SymIntExprs(len(plan.scalars))
        for i, scalar in enumerate(plan.scalars):
            extra_args[i] = trtp.SymInt32(trt_value(scalar))
        return plan.kernel, ptx, params, extra_args

    aot_impl.__signature__ = _signature(
        binding, attrs=False, tail=(("outputs", tuple[trtp.TensorDesc]), ("tactic", int)),
        returns=tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs])
    return aot_impl


_REGISTERED: set = set()


def register_plugins() -> list[str]:
    """Register every op as a TensorRT AOT plugin (once per process); returns the qualified names."""
    from trt_fusedattn.tensorrt import require_tensorrt
    require_tensorrt()
    import tensorrt.plugin as trtp
    for binding in bindings():
        name = binding.contract.qualified_name
        if name in _REGISTERED:
            continue
        trtp.register(name)(make_register(binding))
        trtp.autotune(name)(make_autotune(binding))
        trtp.aot_impl(name)(make_aot_impl(binding))
        _REGISTERED.add(name)
    return sorted(_REGISTERED)
