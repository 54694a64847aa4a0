"""Drive our plugins the way TensorRT's ONNX parser and builder do, through NVIDIA's ``tensorrt.plugin`` code
over the stand-in (``standin.py``). Nothing here builds an engine: it runs every call TensorRT makes into a
Python AOT plugin, in TensorRT's order, and checks what TensorRT would check, each rule with its source:

Parser (onnx-tensorrt ``onnxOpImporters.cpp``: ``FallbackPluginImporter``, ``addPluginWithCreator``,
``loadFields``, ``copyField``):
  P1 the creator is looked up by (op type, attribute ``plugin_version`` default "1", attribute
     ``plugin_namespace`` default "");
  P2 only the creator's declared fields are read from the node; a field missing on the node is skipped;
     each is typed by its ONNX attribute type: INT -> one INT32, FLOAT -> one FLOAT32, INTS -> INT32s,
     FLOATS -> FLOAT32s, STRING -> CHAR with a trailing NUL;
  P3 an empty input name becomes a null input tensor; ``addPluginV3`` rejects null inputs;
  P4 under ``PREFER_AOT_PYTHON_PLUGINS`` the creator is asked for an AOT plugin (TensorRT 10.9 release notes:
     the parser's AOT Python plugin support; ``QuickPluginCreationRequest``).
Network (onnx-tensorrt ``docs/operators.md``, "Quantized Types"):
  N1 an FP8 tensor exists only as the output of a quantization (QuantizeLinear), not as an initializer or
     graph input.
Builder (TensorRT developer guide, "I/O Formats" table and ``TensorFormat`` docs; strongly typed networks):
  B1 the plugin's output type is what ``get_output_data_types`` says; no type is chosen for it;
  B2 a type/format combination is usable only if its input types are the network's tensor types and its
     output types are B1's;
  B3 a format must be legal for its type: LINEAR any, HWC8 FP16/BF16, HWC16 FP16/INT8/FP8, HWC FP32/UINT8,
     and a vectorized format needs rank >= 3;
  B4 every usable combination is configured and each of its tactics (none: the default 0) gets launch
     parameters and a kernel (``get_launch_params``, ``get_kernel``), as the builder times them all.
Kernel (the AOT plugin ABI, ``tensorrt.plugin.aot_impl`` docs):
  K1 the PTX entry named by the plugin takes the input pointers, then one 32-bit scalar per extra argument,
     then the output pointers.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import helper

from tensorrt_conformance import standin
from trt_fusedattn.plugins.op_record import OpRecord
from trt_fusedattn.tensorrt import plugins as trt_plugins
from trt_fusedattn.tensorrt.prepare import PLUGIN_NAMESPACE, PRESENT_INPUTS, element_types, prepare_model, record_of

ONNX_TO_TRT = {onnx.TensorProto.FLOAT: "FLOAT", onnx.TensorProto.FLOAT16: "HALF", onnx.TensorProto.BFLOAT16: "BF16",
               onnx.TensorProto.INT32: "INT32", onnx.TensorProto.INT64: "INT64", onnx.TensorProto.BOOL: "BOOL",
               onnx.TensorProto.INT8: "INT8", onnx.TensorProto.UINT8: "UINT8",
               onnx.TensorProto.FLOAT8E4M3FN: "FP8"}
LEGAL_FORMATS = {"LINEAR": None, "HWC8": {"HALF", "BF16"}, "HWC16": {"HALF", "INT8", "FP8"},
                 "HWC": {"FLOAT", "UINT8"}}  # B3; None: every type


class BuildFailure(AssertionError):
    """A rule TensorRT would enforce was broken; the message names the node and the rule."""


@contextlib.contextmanager
def tensorrt_line(version: str, plugin_dir: Path):
    """``import tensorrt`` / ``tensorrt.plugin`` give the stand-in and NVIDIA's plugin package of ``version``
    while the block runs; the previous modules come back afterwards."""
    saved = {k: v for k, v in sys.modules.items() if k == "tensorrt" or k.startswith("tensorrt.")}
    for name in saved:
        del sys.modules[name]
    trt = standin.make_module(version)
    sys.modules["tensorrt"] = trt
    try:
        spec = importlib.util.spec_from_file_location("tensorrt.plugin", plugin_dir / "__init__.py",
                                                      submodule_search_locations=[str(plugin_dir)])
        trtp = importlib.util.module_from_spec(spec)
        sys.modules["tensorrt.plugin"] = trtp
        spec.loader.exec_module(trtp)
        trt.plugin = trtp
        yield trt, trtp
    finally:
        for name in [k for k in sys.modules if k == "tensorrt" or k.startswith("tensorrt.")]:
            del sys.modules[name]
        sys.modules.update(saved)


@dataclass
class PluginLaunch:
    """What the builder got from one plugin node for one type/format combination and tactic."""

    node: str
    op: OpRecord
    types: tuple            # TensorRT type names, inputs then output
    formats: tuple          # TensorRT format names, inputs then output
    kernel: str
    ptx: str
    launch: dict            # grid_x ... shared_mem -> IDimensionExpr
    extra_args: list        # IDimensionExpr per int32 scalar
    env: dict               # named dimension -> concrete value
    other_env: dict         # the same at the second run's input sizes
    input_shapes: list      # concrete shape per contract input (None when absent)
    other_shapes: list      # the same at the second run's input sizes
    input_dtypes: list      # dtype name per contract input (None when absent)
    attrs: dict             # the node's resolved attributes

    def value(self, expr, other: bool = False) -> int:
        return expr.evaluate(self.other_env if other else self.env)


@dataclass
class SimulatedBuild:
    launches: list = field(default_factory=list)
    notes: list = field(default_factory=list)


def load_fields(trt, creator, node: onnx.NodeProto) -> list:
    """P2: the creator's declared fields from the node's attributes, typed by ONNX attribute type."""
    attrs = {a.name: a for a in node.attribute}
    fields = []
    for declared in creator.field_names:
        attr = attrs.get(declared.name)
        if attr is None:
            continue
        value = helper.get_attribute_value(attr)
        kind = attr.type
        if kind == onnx.AttributeProto.INT:
            fields.append(trt.PluginField(attr.name, [value], trt.PluginFieldType.INT32))
        elif kind == onnx.AttributeProto.FLOAT:
            fields.append(trt.PluginField(attr.name, [value], trt.PluginFieldType.FLOAT32))
        elif kind == onnx.AttributeProto.INTS:
            fields.append(trt.PluginField(attr.name, list(value), trt.PluginFieldType.INT32))
        elif kind == onnx.AttributeProto.FLOATS:
            fields.append(trt.PluginField(attr.name, list(value), trt.PluginFieldType.FLOAT32))
        elif kind == onnx.AttributeProto.STRING:
            fields.append(trt.PluginField(attr.name, bytes(value) + b"\0", trt.PluginFieldType.CHAR))
        else:
            raise BuildFailure(f"P2: attribute {attr.name} of type {kind} is unsupported as a plugin field")
    return fields


def _string_attr(node: onnx.NodeProto, name: str, default: str) -> str:
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr).decode()
    return default


_OBSERVED: dict = {}  # (model digest, dims) -> observed_shapes: the same for every TensorRT line


def observed_shapes(model: onnx.ModelProto, dims: dict | None) -> dict:
    """{tensor: (ONNX element type, shape)} of every tensor of ``model`` run by onnxruntime (custom nodes by their
    numpy reference) on the verifier's random inputs with ``dims`` (ONNX shape inference cannot follow the
    shape arithmetic of exported graphs); computed once per model and dims."""
    key = (hashlib.sha256(model.SerializeToString()).hexdigest(), tuple(sorted((dims or {}).items())))
    if key not in _OBSERVED:
        _OBSERVED[key] = _run_for_shapes(model, dims)
    return _OBSERVED[key]


def _run_for_shapes(model: onnx.ModelProto, dims: dict | None) -> dict:
    from trt_fusedattn.ort_session import run_model
    from trt_fusedattn.random_inputs import random_inputs
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    listed = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name and name not in listed:
                probe.graph.output.append(onnx.ValueInfoProto(name=name))
                listed.add(name)
    feeds = random_inputs(probe, dims=dims)
    arrays = {**feeds, **run_model(probe, feeds)}
    types = element_types(model)  # onnxruntime hands float8 tensors back as bytes
    info = {n: (types.get(n) or helper.np_dtype_to_tensor_dtype(a.dtype), tuple(a.shape)) for n, a in arrays.items()}
    info.update({t.name: (t.data_type, tuple(t.dims)) for t in model.graph.initializer})
    return info


class _Shapes:
    """Element types and dims of the prepared model's tensors as TensorRT sees them: a dim equal in two runs of
    the fused model at different input sizes (the second doubles every named dim) is a build-time constant,
    others are named run-time dims (valued from the first run); the outputs of plugin nodes are the plugin's own
    ``get_output_shapes`` expressions, as in TensorRT. Tensors ``prepare_model`` adds (Cast, Unsqueeze, Squeeze,
    QuantizeLinear, Pad, Slice) follow their input."""

    def __init__(self, fused: onnx.ModelProto, prepared: onnx.ModelProto, dims: dict):
        self.first = observed_shapes(fused, dims)
        self.second = observed_shapes(fused, {k: 2 * v for k, v in dims.items()})  # doubled: UNets stay even
        self.producers = {o: n for n in prepared.graph.node for o in n.output}
        self.initializers = {t.name: t for t in prepared.graph.initializer}
        self.prepared_init = {t.name: (t.data_type, tuple(t.dims)) for t in prepared.graph.initializer}
        self.outputs: dict = {}  # plugin output -> (element type, [IDimensionExpr])
        self.env: dict = {}      # named dimension -> value in the first run
        self.other_env: dict = {}  # ... and in the second

    def _derived(self, name: str, run: dict):
        if name in run:
            return run[name]
        if name in self.prepared_init:
            return self.prepared_init[name]
        node = self.producers[name]
        env = self.env if run is self.first else self.other_env
        elem, shape = self._derived(node.input[0], run) if node.input[0] not in self.outputs else \
            (self.outputs[node.input[0]][0], tuple(e.evaluate(env) for e in self.outputs[node.input[0]][1]))
        if node.op_type == "Cast":
            return helper.get_attribute_value(node.attribute[0]), shape
        if node.op_type == "Unsqueeze":
            return elem, shape[:2] + (1,) + shape[2:]
        if node.op_type == "Squeeze":
            return elem, shape[:2] + shape[3:]
        if node.op_type == "QuantizeLinear":
            return onnx.TensorProto.FLOAT8E4M3FN, shape
        if node.op_type == "Slice":
            ends = [int(e) for e in onnx.numpy_helper.to_array(self.initializers[node.input[2]])]
            return elem, shape[:1] + (ends[0],) + shape[2:]
        if node.op_type == "Pad":
            pads = [int(p) for p in onnx.numpy_helper.to_array(self.initializers[node.input[1]])]
            return elem, tuple(d + pads[i] + pads[i + len(shape)] for i, d in enumerate(shape))
        raise BuildFailure(f"no shape for {name} (made by a {node.op_type} the simulation does not follow)")

    def elem_type(self, name: str) -> int:
        return self.outputs[name][0] if name in self.outputs else self._derived(name, self.first)[0]

    def dims(self, trt, builder, name: str) -> list:
        """TensorRT's view of one tensor's dims (``env`` gets each named dim's value)."""
        if name in self.outputs:
            return list(self.outputs[name][1])
        (_, first), (_, second) = self._derived(name, self.first), self._derived(name, self.second)
        exprs = []
        for axis, (a, b) in enumerate(zip(first, second)):
            if a == b:
                exprs.append(builder.constant(a))
            else:
                key = f"{name}[{axis}]"
                self.env[key], self.other_env[key] = a, b
                exprs.append(trt.IDimensionExpr(name=key))
        return exprs

    def concrete(self, name: str, other: bool = False) -> tuple:
        if name in self.outputs:
            return tuple(e.evaluate(self.other_env if other else self.env) for e in self.outputs[name][1])
        return tuple(self._derived(name, self.second if other else self.first)[1])

    def known(self, name: str) -> bool:
        try:
            self.elem_type(name)
            return True
        except KeyError:
            return False


def _network_checks(model: onnx.ModelProto) -> None:
    """N1: FP8 tensors feeding our plugins come from a QuantizeLinear."""
    producers = {o: n for n in model.graph.node for o in n.output}
    fp8_consts = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT8E4M3FN}
    fp8_consts |= {i.name for i in model.graph.input
                   if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT8E4M3FN}
    for node in model.graph.node:
        if record_of(node) is None:
            continue
        for name in node.input:
            if name in fp8_consts and (name not in producers or producers[name].op_type != "QuantizeLinear"):
                raise BuildFailure(f"N1: {node.op_type} node '{node.name}' reads the FP8 tensor {name} that no "
                                   "QuantizeLinear produces (FP8 is a quantized type in TensorRT)")


_PARAM = re.compile(r"\.param\s+\.(\w+)")


def entry_parameters(ptx: str, kernel: str) -> list[str]:
    """The PTX types of ``kernel``'s parameters (``u64``, ``u32``, ...), in order."""
    match = re.search(rf"\.entry\s+{re.escape(kernel)}\s*\((.*?)\)", ptx, re.S)
    if match is None:
        raise BuildFailure(f"K1: the PTX has no entry {kernel}")
    return _PARAM.findall(match.group(1))


def _contract_order(op: OpRecord, node: onnx.NodeProto, values: list) -> list:
    """Per contract input: the value of the tensor TensorRT passes, or None where the input is absent."""
    mask = next(helper.get_attribute_value(a) for a in node.attribute if a.name == PRESENT_INPUTS)
    present = [i for i in range(len(op.contract.inputs)) if mask >> i & 1]
    out = [None] * len(op.contract.inputs)
    for i, value in zip(present, values):
        out[i] = value
    return out


def _build_plugin_node(trt, node, shapes: _Shapes, result: SimulatedBuild) -> None:
    op = record_of(node)
    where = f"{node.op_type} node '{node.name or node.output[0]}'"
    namespace = _string_attr(node, PLUGIN_NAMESPACE, "")
    creator = trt.get_plugin_registry().get_creator(node.op_type, _string_attr(node, "plugin_version", "1"),
                                                    namespace)
    if creator is None:
        raise BuildFailure(f"P1: no plugin creator for {where} in namespace '{namespace}'")
    fields = load_fields(trt, creator, node)
    if any(not name for name in node.input):
        raise BuildFailure(f"P3: {where} has an empty input: the parser passes a null tensor to addPluginV3")
    plugin = creator.create_plugin(node.op_type, namespace, trt.PluginFieldCollection(fields),
                                   trt.TensorRTPhase.BUILD, trt.QuickPluginCreationRequest.PREFER_AOT)
    if not isinstance(plugin, trt.IPluginV3QuickAOTBuild):
        raise BuildFailure(f"P4: the creator made a {type(plugin).__name__} for {where}, not an AOT plugin")

    builder, env = trt.IExprBuilder(), shapes.env
    in_types = [getattr(trt.DataType, ONNX_TO_TRT[shapes.elem_type(n)]) for n in node.input]
    in_exprs = [shapes.dims(trt, builder, n) for n in node.input]
    out_types = plugin.get_output_data_types(in_types, [len(e) for e in in_exprs])  # B1
    dims_in = []
    for exprs in in_exprs:
        d = trt.DimsExprs(len(exprs))
        d[:] = exprs
        dims_in.append(d)
    out_exprs = [list(e) for e in plugin.get_output_shapes(dims_in, [], builder)]
    concrete_in = [shapes.concrete(n) for n in node.input]
    concrete_out = [tuple(e.evaluate(env) for e in exprs) for exprs in out_exprs]

    def descs(types, formats):
        out = []
        for i, shape in enumerate(concrete_in + concrete_out):
            desc = trt.PluginTensorDesc()
            desc.dims, desc.type, desc.format = trt.Dims(shape), types[i], formats[i]
            out.append(trt.DynamicPluginTensorDesc(desc, shape, shape, shape))
        return out

    n_in, n_io = len(node.input), len(node.input) + len(out_types)
    flat = plugin.get_supported_format_combinations(
        descs(in_types + list(out_types), [trt.TensorFormat.LINEAR] * n_io), n_in)
    combos = [flat[i:i + n_io] for i in range(0, len(flat), n_io)]
    network_types = in_types + list(out_types)
    ranks = [len(s) for s in concrete_in + concrete_out]

    def legal(combo) -> bool:
        if [c.type for c in combo] != network_types:  # B2
            return False
        for desc, rank in zip(combo, ranks):  # B3
            allowed = LEGAL_FORMATS.get(desc.format.name, set())
            if allowed is not None and (desc.type.name not in allowed or rank < 3):
                return False
        return True

    usable = [c for c in combos if legal(c)]
    if not usable:
        offered = [" ".join(f"{c.type.name}/{c.format.name}" for c in combo) for combo in combos]
        raise BuildFailure(f"B2/B3: no usable type/format combination for {where}: the network's types are "
                           f"{[t.name for t in network_types]}, the plugin offers {offered}")
    for combo in usable:  # B4
        io = descs([c.type for c in combo], [c.format for c in combo])
        plugin.configure_plugin(io[:n_in], io[n_in:])
        for tactic in plugin.get_valid_tactics() or [0]:
            plugin.set_tactic(tactic)
            params, setter = trt.KernelLaunchParams(), trt.SymExprSetter()
            plugin.get_launch_params(dims_in, io, n_in, params, setter, builder)
            kernel, ptx = plugin.get_kernel([d.desc for d in io[:n_in]], [d.desc for d in io[n_in:]])
            kernel = kernel.decode() if isinstance(kernel, bytes) else kernel
            launch = {k: getattr(params, k).expr for k in ("grid_x", "grid_y", "grid_z", "block_x", "block_y",
                                                          "block_z", "shared_mem")}
            extra = [setter[i].expr for i in range(setter.nbSymExprs)]
            attrs = op.contract.resolve({a.name: helper.get_attribute_value(a) for a in node.attribute
                                         if a.name not in (PRESENT_INPUTS, PLUGIN_NAMESPACE)})
            dtypes = [trt_plugins._DTYPE_NAMES[t.name] for t in in_types]
            result.launches.append(PluginLaunch(
                node.name or node.output[0], op, tuple(c.type.name for c in combo),
                tuple(c.format.name for c in combo), kernel, ptx.decode() if isinstance(ptx, bytes) else ptx,
                launch, extra, dict(env), dict(shapes.other_env), _contract_order(op, node, concrete_in),
                _contract_order(op, node, [shapes.concrete(n, other=True) for n in node.input]),
                _contract_order(op, node, dtypes), attrs))
    out_elem = next(k for k, v in ONNX_TO_TRT.items() if v == out_types[0].name)
    shapes.outputs[node.output[0]] = (out_elem, out_exprs[0])


def simulate(trt, trtp, model: onnx.ModelProto, precision: str | None, dims: dict | None = None) -> SimulatedBuild:
    """Register our plugins with ``trtp``, prepare ``model`` (a fused model) as ``build_engine`` does, and run
    every plugin node through the parser and builder calls above; ``dims``: sizes of the named input dims (the
    verifier's defaults: batch 2, sequences 17, image sides 32)."""
    from trt_fusedattn.random_inputs import concrete_shape, graph_inputs
    result = SimulatedBuild()
    trt_plugins.register_ops(trtp)
    prepared = prepare_model(model, precision, result.notes)
    _network_checks(prepared)
    dims = dict(dims or {})
    for value in graph_inputs(model):
        concrete_shape(value, dims)
    shapes = _Shapes(model, prepared, dims)
    for node in prepared.graph.node:  # in the model's (topological) order, as the parser adds layers
        if record_of(node) is not None:
            _build_plugin_node(trt, node, shapes, result)
    return result
