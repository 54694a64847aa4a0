"""The ONNX model handed to TensorRT's parser: our custom nodes in the form the parser and our plugins expect.

``prepare_model(model, precision)`` returns a copy in which every custom node

- has no empty inputs: the parser passes an empty input name as a null tensor, which ``addPluginV3`` rejects;
  the int attribute ``present_inputs`` (bit i = contract input i) says which contract inputs remain;
- carries ``plugin_namespace`` (the parser looks the creator up by op type, ``plugin_version`` (default "1") and
  this attribute, default "");
- is 2-D when it is a 1-D FusedConv: TensorRT's channels-last formats vectorize the third dimension from the
  end, which for [N, C, W] would be N, so X and residual get an Unsqueeze to [N, C, 1, W], W (OHWI) to
  [K, 1, kW, C/G], the attributes a leading 1 / 0, and the output a Squeeze back to [N, K, W];
- writes a multiple of 8 output channels: TensorRT's HWC8 pads channels to 8 and our kernels write Y (and read
  the residual) unpadded, so a group-1 FusedConv with K % 8 != 0 (an RGB output layer) computes K rounded up
  to 8 channels with zero weights, shift and scale in the extra ones (a Pad gives the residual zero channels)
  and a Slice keeps the first K; X needs nothing: its padded pixel stride is a kernel argument;
- reads FP8 weights through a QuantizeLinear: TensorRT treats FP8 as a quantized type that exists only as the
  output of a quantization (onnx-tensorrt ``docs/operators.md``), so an float8_e4m3fn initializer feeding our
  node becomes its float16 copy (exact: every e4m3 value is a float16) quantized with scale 1 (exact again)
  by a QuantizeLinear (opset >= 19);
- computes in 16-bit: networks are strongly typed (TensorRT 11 has no other kind; 10.x builds them so here),
  and our kernels take float16/bfloat16. A float32 node gets Cast(precision) on its main float inputs and a
  Cast back to float32 on its output when ``precision`` is fp16/bf16/fp8; otherwise the model is refused with
  one line saying how to convert it. A 16-bit node whose dtype differs from the asked precision is refused.

Each change is described in the returned notes (what the report prints).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trt_fusedattn.contract import DOMAIN
from trt_fusedattn.element_types import element_types, record_of
from trt_fusedattn.errors import FuseError
from trt_fusedattn.qdq import QDQ_OPSET, declare_opset
from trt_fusedattn.tensorrt import PLUGIN_NAMESPACE, PRECISIONS, PRESENT_INPUTS

_ELEMENT = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16", TensorProto.FLOAT: "float32",
            TensorProto.FLOAT8E4M3FN: "float8_e4m3fn", TensorProto.INT32: "int32", TensorProto.BOOL: "bool",
            TensorProto.INT64: "int64"}
_PRECISION_TYPE = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16, "fp8": TensorProto.FLOAT16}
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


class ModelPrecisionError(FuseError):
    """The model's custom nodes are not in a dtype our kernels run, and no precision was asked to cast them."""

    exit_code = 1


def _cast(source: str, to: int, owner: str) -> onnx.NodeProto:
    target = f"{source}_{_ELEMENT[to]}_{owner}"
    return helper.make_node("Cast", [source], [target], name=target, to=to)


def _to_16_bit(node, op, types: dict, precision: str | None, notes: list) -> list:
    """Nodes to put before ``node`` (Casts of float32 main inputs) and after it (the Cast back)."""
    specs = op.contract.inputs
    main = [i for i, n in enumerate(node.input) if n and specs[i].name in op.main_inputs
            and types.get(n) in _FLOATS]
    kinds = {types[node.input[i]] for i in main}
    where = f"{op.contract.name} node '{node.name or node.output[0]}'"
    if TensorProto.FLOAT not in kinds:
        wanted = _PRECISION_TYPE.get(precision)
        if wanted and kinds and kinds != {wanted}:
            have = "/".join(sorted(_ELEMENT[k] for k in kinds))
            own = "bf16" if "bfloat16" in have else "fp16"
            raise ModelPrecisionError(f"{where} computes in {have} but precision {precision} was asked; "
                                      f"build with the model's own precision ({own})")
        return [], []
    if precision not in _PRECISION_TYPE:
        raise ModelPrecisionError(f"{where} takes float32 inputs and our kernels run float16/bfloat16: build with "
                                  "precision fp16 or bf16 (fuse-onnx --fp16/--bf16) to cast around each custom "
                                  "node, or export the model in float16")
    to = _PRECISION_TYPE[precision]
    before = [_cast(node.input[i], to, node.name or node.output[0]) for i in main]
    for i, cast in zip(main, before):
        node.input[i] = cast.output[0]
    out = node.output[0]
    if types.get(out) != TensorProto.FLOAT:  # an FP8 producer's e4m3 output (output_scale) is read as it is
        notes.append(f"{where}: float32 inputs cast to {_ELEMENT[to]} (precision {precision})")
        return before, []
    node.output[0] = f"{out}_{precision}"
    after = [helper.make_node("Cast", [node.output[0]], [out], name=f"{out}_cast_float32", to=TensorProto.FLOAT)]
    notes.append(f"{where}: float32 inputs cast to {_ELEMENT[to]} and its output back to float32 (precision "
                 f"{precision})")
    return before, after


def _lift_1d_conv(graph, node, initializers: dict, types: dict, notes: list) -> tuple[list, list]:
    """Nodes before/after a 1-D FusedConv that make it 2-D (see the module docstring); the node is changed."""
    from trt_fusedattn.plugins.conv.contract import FUSED_CONV
    attrs = FUSED_CONV.node_attributes(node)
    w = initializers.get(node.input[1])
    if w is None or len(w.dims) != 3:
        return [], []
    array = numpy_helper.to_array(w)
    lifted = numpy_helper.from_array(array.reshape(array.shape[0], 1, *array.shape[1:]), f"{w.name}_2d")
    graph.initializer.append(lifted)
    types[lifted.name] = w.data_type
    initializers[lifted.name] = lifted
    node.input[1] = lifted.name
    axes = f"{node.name or node.output[0]}_axes_2d"
    graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), axes))
    before = []
    for i in (0, 4):
        if i < len(node.input) and node.input[i]:
            target = f"{node.input[i]}_2d_{node.name or node.output[0]}"
            before.append(helper.make_node("Unsqueeze", [node.input[i], axes], [target], name=target))
            types[target] = types.get(node.input[i])
            node.input[i] = target
    out = node.output[0]
    node.output[0] = f"{out}_2d"
    after = [helper.make_node("Squeeze", [node.output[0], axes], [out], name=f"{out}_squeeze_1d")]
    new = {"strides": [1, *(attrs["strides"] or (1,))], "dilations": [1, *(attrs["dilations"] or (1,))],
           "pads": [0, (attrs["pads"] or (0, 0))[0], 0, (attrs["pads"] or (0, 0))[1]]}
    for attr in [a for a in node.attribute if a.name in new]:
        node.attribute.remove(attr)
    node.attribute.extend(helper.make_attribute(k, v) for k, v in new.items())
    notes.append(f"FusedConv node '{node.name or out}': 1-D convolution run as 2-D (H = 1) for TensorRT's "
                 "channels-last formats")
    return before, after


CHANNEL_MULTIPLE = 8  # HWC8


def _zero_padded(initializers: dict, graph, name: str, rows: int, suffix: str) -> str:
    """An initializer ``name`` with ``rows`` zero rows appended along axis 0; returns its name."""
    array = numpy_helper.to_array(initializers[name])
    padded = numpy_helper.from_array(np.concatenate([array, np.zeros((rows, *array.shape[1:]), array.dtype)]),
                                     f"{name}_{suffix}")
    graph.initializer.append(padded)
    initializers[padded.name] = padded
    return padded.name


def _pad_output_channels(model, node, initializers: dict, types: dict, notes: list) -> tuple[list, list]:
    """Nodes before/after a group-1 FusedConv with K % 8 != 0 that let it write K rounded up to 8 channels."""
    from trt_fusedattn.plugins.conv.contract import FUSED_CONV
    w = initializers.get(node.input[1])
    per_channel = [node.input[i] for i in (2, 3) if i < len(node.input) and node.input[i]]
    if (w is None or len(w.dims) != 4 or not w.dims[0] % CHANNEL_MULTIPLE
            or FUSED_CONV.node_attributes(node)["group"] != 1 or any(n not in initializers for n in per_channel)):
        return [], []
    k = w.dims[0]
    extra = -k % CHANNEL_MULTIPLE
    owner = node.name or node.output[0]
    graph, suffix = model.graph, f"k{k + extra}"
    for i in (1, 2, 3):
        if i < len(node.input) and node.input[i]:
            node.input[i] = _zero_padded(initializers, graph, node.input[i], extra, suffix)
            types[node.input[i]] = initializers[node.input[i]].data_type
    graph.initializer.extend([
        numpy_helper.from_array(np.array([0, 0, 0, 0, 0, extra, 0, 0], np.int64), f"{owner}_channel_pads"),
        numpy_helper.from_array(np.array([0], np.int64), f"{owner}_slice_starts"),
        numpy_helper.from_array(np.array([k], np.int64), f"{owner}_slice_ends"),
        numpy_helper.from_array(np.array([1], np.int64), f"{owner}_slice_axes")])
    before = []
    if len(node.input) > 4 and node.input[4]:
        target = f"{node.input[4]}_{suffix}_{owner}"
        before.append(helper.make_node("Pad", [node.input[4], f"{owner}_channel_pads"], [target], name=target))
        types[target] = types.get(node.input[4])
        node.input[4] = target
    out = node.output[0]
    node.output[0] = f"{out}_{suffix}"
    after = [helper.make_node("Slice", [node.output[0], f"{owner}_slice_starts", f"{owner}_slice_ends",
                                        f"{owner}_slice_axes"], [out], name=f"{out}_slice")]
    notes.append(f"FusedConv node '{owner}': {k} output channels computed as {k + extra} (zero weights) and "
                 f"sliced back (TensorRT's HWC8 pads channels to 8)")
    return before, after


FP8_OPSET = QDQ_OPSET  # QuantizeLinear to float8e4m3fn


def _raise_opset(model, version: int, why: str, notes: list) -> None:
    """Declare the default-domain opset ``version`` in ``model`` (a copy: ``qdq.declare_opset``); one line when a
    subgraph makes that unsafe."""
    try:
        old = declare_opset(model, version)
    except ValueError:
        raise ModelPrecisionError(f"{why} reads FP8 weights, which TensorRT takes only from a QuantizeLinear "
                                  f"(opset >= {version}), and the model's subgraphs keep its opset from being "
                                  f"raised: export it with opset {version}+") from None
    if old is not None:
        notes.append(f"opset {old} declared as {version} in the model TensorRT parses (QuantizeLinear to "
                     "FP8 needs it; reductions' axes moved to inputs)")


def _quantized_weights(model, node, initializers: dict, notes: list) -> list:
    """QuantizeLinear nodes that give ``node`` its FP8 initializers as quantized float16 constants."""
    fp8 = [i for i, n in enumerate(node.input) if n in initializers
           and initializers[n].data_type == TensorProto.FLOAT8E4M3FN]
    if not fp8:
        return []
    graph, before = model.graph, []
    for i in fp8:
        name = node.input[i]
        owner = node.name or node.output[0]
        if f"{name}_float16" not in initializers:  # once per weight, however many nodes read it
            values = numpy_helper.to_array(initializers[name]).astype(np.float16)
            added = [numpy_helper.from_array(values, f"{name}_float16"),
                     numpy_helper.from_array(np.array(1.0, np.float16), f"{name}_unit_scale"),
                     helper.make_tensor(f"{name}_zero_point", TensorProto.FLOAT8E4M3FN, [], [0])]
            graph.initializer.extend(added)
            initializers.update((t.name, t) for t in added)
        quantized = f"{name}_e4m3_{owner}"
        before.append(helper.make_node("QuantizeLinear", [f"{name}_float16", f"{name}_unit_scale",
                                                          f"{name}_zero_point"], [quantized], name=quantized))
        node.input[i] = quantized
    notes.append(f"{node.op_type} node '{node.name or node.output[0]}': FP8 weights given to TensorRT as float16 "
                 "constants quantized by QuantizeLinear "
                 "(exact)")
    return before


def _mark_present(node: onnx.NodeProto) -> None:
    present = [i for i, name in enumerate(node.input) if name]
    names = [node.input[i] for i in present]
    del node.input[:]
    node.input.extend(names)
    for attr in [a for a in node.attribute if a.name in (PRESENT_INPUTS, PLUGIN_NAMESPACE)]:
        node.attribute.remove(attr)
    node.attribute.extend([helper.make_attribute(PRESENT_INPUTS, sum(1 << i for i in present)),
                           helper.make_attribute(PLUGIN_NAMESPACE, DOMAIN)])


def prepare_model(model: onnx.ModelProto, precision: str | None = None,
                  notes: list | None = None) -> onnx.ModelProto:
    """A copy of ``model`` whose custom nodes TensorRT's parser maps to our plugins (see the module docstring).
    ``precision``: None (the model's own dtypes), fp16, bf16, fp8 (FP8 FusedConv nodes as they are, float32
    nodes cast to float16) or fp32 (no casts). What was changed is appended to ``notes``."""
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    notes = [] if notes is None else notes
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    if not any(record_of(n) for n in graph.node):
        return model
    types = element_types(model)
    initializers = {t.name: t for t in graph.initializer}
    fp8_reader = next((n for n in graph.node if record_of(n) and any(
        i in initializers and initializers[i].data_type == TensorProto.FLOAT8E4M3FN for i in n.input)), None)
    if fp8_reader is not None:
        _raise_opset(model, FP8_OPSET, f"{fp8_reader.op_type} node '{fp8_reader.name or fp8_reader.output[0]}'",
                     notes)
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        op = record_of(node)
        if op is None:
            graph.node.append(node)
            continue
        before, after = [], []
        if op.contract.name == "FusedConv":  # lifted first: the lift reshapes W while it is an initializer
            before, after = _lift_1d_conv(graph, node, initializers, types, notes)
            pad_before, pad_after = _pad_output_channels(model, node, initializers, types, notes)
            before, after = before + pad_before, pad_after + after
        cast_before, cast_after = _to_16_bit(node, op, types, precision, notes)
        before, after = before + cast_before + _quantized_weights(model, node, initializers, notes), \
            cast_after + after
        _mark_present(node)
        graph.node.extend([*before, node, *after])
    return model
