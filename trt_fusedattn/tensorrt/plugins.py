"""Our ops as TensorRT AOT Python plugins (``tensorrt.plugin``), generated from each op record (``plugins.OPS``).

``register_plugins()`` registers every op (``trt_fusedattn::FusedAttention``, ``trt_fusedattn::FusedConv``) with

- ``@trtp.register``: the output's shape and dtype from the record's ``output_shape`` / ``output_dtype``
  (FusedConv with float8_e4m3fn X writes float16);
- ``@trtp.autotune``: one type combination per main element type (FP16, BF16: the record's ``main_inputs`` take
  it when they are floating point, the others keep the network's dtype), LINEAR formats except the tensors the
  op reads channels-last (the record's ``channels_last``, rank 4): ``HWC8`` for float16/bfloat16, ``HWC16`` for
  float8 (TensorRT's I/O format table binds HWC8 to FP16/BF16, HWC16 to FP16/INT8/FP8);
- ``@trtp.aot_impl``: the record's ``plan`` evaluated on TensorRT's symbolic shapes (``symbolic.py``), its
  source compiled to PTX for the building GPU (the launcher's cache), returned as (kernel name, PTX,
  KernelLaunchParams(grid, block, shared memory), int32 extra args).

Attributes: the ONNX parser passes an ONNX INT as a one-element int32 array, FLOAT as float32, INTS as int32,
STRING as NUL-terminated chars (onnx-tensorrt ``loadFields``). ``tensorrt.plugin`` before 11.0 turns a field
annotated ``int``/``float`` into a number with ``int(array)``, which NumPy >= 2.4 refuses for a one-element
array, so every int and float attribute (and ``present_inputs``) is declared an int32/float32 array and read
back as a number here. Only the attributes present on the node reach the plugin (defaults are filled by the
contract). ``prepare.py`` shapes the ONNX model the parser sees (present inputs, namespace, 1-D convs, casts).
"""
from __future__ import annotations

import inspect
from typing import Callable

import numpy as np
from numpy import typing as npt

from trt_fusedattn.launcher.compile import compile_ptx
from trt_fusedattn.plugins.op_record import OpRecord
from trt_fusedattn.tensorrt import CHANNELS_LAST_FORMATS
from trt_fusedattn.tensorrt import PRESENT_INPUTS
from trt_fusedattn.tensorrt.symbolic import plan_shape, trt_value

_ATTR_KEY = "_trt_fusedattn_attrs"  # resolved attributes carried on the output TensorDesc to autotune and aot_impl
_DTYPE_NAMES = {"HALF": "float16", "BF16": "bfloat16", "FLOAT": "float32", "INT32": "int32", "INT64": "int64",
                "INT8": "int8", "BOOL": "bool", "FP8": "float8_e4m3fn", "UINT8": "uint8"}
_AUTOTUNE_TYPE = {"HALF": "FP16", "FLOAT": "FP32"}  # AutoTuneCombination's spelling of a trt.DataType name
MAIN_TYPES = ("FP16", "BF16")


def ops() -> tuple[OpRecord, ...]:
    """The op records registered as plugins (``plugins.OPS``)."""
    from trt_fusedattn.plugins import OPS
    return OPS


def _attr_annotation(kind: str):
    return {"int": npt.NDArray[np.int32], "float": npt.NDArray[np.float32], "string": str,
            "ints": npt.NDArray[np.int32]}[kind]


def _canonical_attr(value, kind: str):
    """A plugin field as the contract takes it: strings lose the parser's trailing NUL, one-element arrays of an
    int/float attribute become the number, int arrays a tuple."""
    if isinstance(value, str):
        return value.rstrip("\0")
    if isinstance(value, np.ndarray):
        flat = value.reshape(-1)
        if kind in ("int", "float"):
            if flat.size != 1:
                raise ValueError(f"a {kind} attribute arrived as {flat.size} values")
            return int(flat[0]) if kind == "int" else float(flat[0])
        return tuple(int(v) for v in flat)
    return value


def _input_names(op: OpRecord, n_given: int, present_mask: int | None) -> list[str]:
    """The contract names of the tensors TensorRT passes, in order."""
    names = [t.name for t in op.contract.inputs]
    if present_mask is None:
        present_mask = (1 << n_given) - 1
    chosen = [names[i] for i in range(len(names)) if present_mask >> i & 1]
    if len(chosen) != n_given:
        raise ValueError(f"{op.contract.qualified_name}: {n_given} inputs given but present_inputs="
                         f"{present_mask:#b} names {chosen}")
    return chosen


def _signature(op: OpRecord, *, attrs: bool, tail: tuple, returns) -> inspect.Signature:
    """The signature tensorrt.plugin validates: every contract input as a TensorDesc, then (optionally) every
    attribute, then ``tail`` (``outputs``, ``tactic``)."""
    import tensorrt.plugin as trtp
    P = inspect.Parameter
    params = [P(t.name, P.POSITIONAL_OR_KEYWORD, annotation=trtp.TensorDesc) for t in op.contract.inputs]
    if attrs:
        params += [P(a.name, P.POSITIONAL_OR_KEYWORD, annotation=_attr_annotation(a.kind))
                   for a in op.contract.attributes]
        params.append(P(PRESENT_INPUTS, P.POSITIONAL_OR_KEYWORD, annotation=npt.NDArray[np.int32]))
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


def _io_by_name(op: OpRecord, descs: list, outputs) -> tuple[dict, list[str]]:
    attrs = getattr(outputs[0], _ATTR_KEY)
    names = _input_names(op, len(descs), attrs[PRESENT_INPUTS])
    return dict(zip(names, descs)), names


def _dtype_name(dtype) -> str:
    return _DTYPE_NAMES.get(dtype.name, dtype.name)


def _trt_dtype(name: str):
    import tensorrt as trt
    return getattr(trt.DataType, next(k for k, v in _DTYPE_NAMES.items() if v == name))


def _contract_dtypes(op: OpRecord, by_name: dict) -> list:
    """One dtype name per contract input (None when absent)."""
    return [_dtype_name(by_name[t.name].dtype) if t.name in by_name else None for t in op.contract.inputs]


def make_register(op: OpRecord):
    """The ``@trtp.register`` function: resolves the attributes (defaults for absent ones), infers the output."""
    import tensorrt.plugin as trtp
    kinds = {a.name: a.kind for a in op.contract.attributes}

    def register(*descs, **fields):
        present = fields.pop(PRESENT_INPUTS, None)
        present = None if present is None else _canonical_attr(present, "int")
        attrs = op.contract.resolve({k: _canonical_attr(v, kinds.get(k, "")) for k, v in fields.items()})
        by_name = dict(zip(_input_names(op, len(descs), present), descs))
        dtype = _trt_dtype(op.output_dtype(_contract_dtypes(op, by_name), attrs))
        first = descs[0]
        if any(getattr(e, "is_fake", False) for e in first.shape_expr):  # the data-type pass: no shapes yet
            out = trtp.from_shape_expr(first.shape_expr, dtype=dtype)
        else:
            shapes = [plan_shape(by_name[t.name].shape_expr) if t.name in by_name else None
                      for t in op.contract.inputs]
            out = trtp.from_shape_expr(tuple(trt_value(d) for d in op.output_shape(shapes, attrs)), dtype=dtype)
        object.__setattr__(out, _ATTR_KEY, {**attrs, PRESENT_INPUTS: present})
        return out

    register.__signature__ = _signature(op, attrs=True, tail=(), returns=trtp.TensorDesc)
    register.__name__ = f"register_{op.name}"
    return register


def _type_name(dtype) -> str:
    return _AUTOTUNE_TYPE.get(dtype.name, dtype.name)


def make_autotune(op: OpRecord):
    """The ``@trtp.autotune`` function: one type/format combination per main element type (FP16, BF16)."""
    import tensorrt.plugin as trtp

    def autotune(*args):
        descs, outputs = list(args[:-1]), args[-1]
        by_name, names = _io_by_name(op, descs, outputs)
        attrs = getattr(outputs[0], _ATTR_KEY)
        output_name = op.contract.outputs[0].name
        offered = []
        for main in MAIN_TYPES:
            follows = {n for n in names if n in op.main_inputs and by_name[n].dtype.name in ("HALF", "BF16", "FLOAT")}
            element = {"FP16": "float16", "BF16": "bfloat16"}[main]
            dtypes = [None if t.name not in by_name else element if t.name in follows else _dtype_name(
                by_name[t.name].dtype) for t in op.contract.inputs]
            try:
                out_type = _type_name(_trt_dtype(op.output_dtype(dtypes, attrs)))
            except ValueError:  # a combination the contract refuses (FP8 attention's mask must be its output dtype)
                continue
            types, formats = [], []
            for name, desc in [(n, by_name[n]) for n in names] + [(output_name, outputs[0])]:
                kind = out_type if name == output_name else main if name in follows else _type_name(desc.dtype)
                types.append(kind)
                channels_last = name in op.channels_last and len(desc.shape_expr) == 4
                dtype = _DTYPE_NAMES.get("HALF" if kind == "FP16" else kind)
                formats.append(CHANNELS_LAST_FORMATS.get(dtype, ("HWC8", 8))[0] if channels_last else "LINEAR")
            if (", ".join(types), ", ".join(formats)) not in offered:  # FP8 Q/K/V with no float input: one
                offered.append((", ".join(types), ", ".join(formats)))
        return [trtp.AutoTuneCombination(types, formats) for types, formats in offered]

    sig = _signature(op, attrs=False, tail=(("outputs", tuple[trtp.TensorDesc]),), returns=None)
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


def make_aot_impl(op: OpRecord):
    """The ``@trtp.aot_impl`` function: the op's plan on TensorRT's shapes, compiled to PTX for this GPU."""
    import tensorrt.plugin as trtp

    def aot_impl(*args):
        descs, outputs, _tactic = _split_call(args)
        by_name, _ = _io_by_name(op, descs, outputs)
        attrs = {k: v for k, v in getattr(outputs[0], _ATTR_KEY).items() if k != PRESENT_INPUTS}
        specs = op.contract.inputs
        shapes = [plan_shape(by_name[t.name].shape_expr) if t.name in by_name else None for t in specs]
        formats = tuple(by_name[t.name].format.name if t.name in by_name else None for t in specs)
        formats += (outputs[0].format.name,)
        extra = {"formats": formats} if _takes_formats(op.plan) else {}
        if not extra and any(f not in (None, "LINEAR") for f in formats):
            raise ValueError(f"{op.contract.qualified_name}: TensorRT chose formats {formats} but "
                             f"plan_{op.name} takes no formats= keyword to adapt to them")
        arch = _building_arch()
        plan = op.plan(shapes, _contract_dtypes(op, by_name), attrs, arch, **extra)
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
        op, attrs=False, tail=(("outputs", tuple[trtp.TensorDesc]), ("tactic", int)),
        returns=tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs])
    return aot_impl


def register_ops(trtp) -> list[str]:
    """Register every op record with the ``tensorrt.plugin`` module ``trtp`` (once per module); returns the
    qualified names. ``register_plugins`` is the public entry (it checks for the builder first)."""
    registered = trtp.__dict__.setdefault("_trt_fusedattn_registered", set())
    for op in ops():
        name = op.contract.qualified_name
        if name in registered:
            continue
        trtp.register(name)(make_register(op))
        trtp.autotune(name)(make_autotune(op))
        trtp.aot_impl(name)(make_aot_impl(op))
        registered.add(name)
    return sorted(registered)


def register_plugins() -> list[str]:
    """Register every op as a TensorRT AOT plugin (once per process); returns the qualified names."""
    from trt_fusedattn.tensorrt import require_tensorrt
    require_tensorrt()
    import tensorrt.plugin as trtp
    return register_ops(trtp)
