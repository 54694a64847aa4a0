"""FP8 chains: a FusedConv whose output is read only as X by FP8 FusedConvs that quantize it with one scale
writes that output in e4m3 itself (``output_scale`` = that scale), so no quantize pass runs between them.

Runs on the fused model after calibration and the Q/DQ absorption (``pipeline.fuse``). A reader that keeps the
producer in 16 bits is named in the producer site's ``details["fp8_output"]``: a residual input (the add needs
y in float), a non-conv op, a graph output, a conv that is not FP8 (depthwise has no FP8 kernel), C/G not a
multiple of 16 (e4m3 X moves 16 channels per load), different input scales, a 1-D convolution. Two forms:

- the readers quantize in the kernel (calibrated models, Q/DQ float32 models): they read the producer's e4m3
  output instead; a reader whose X was float32/bfloat16 computes in float16 from then on (the contract: e4m3 X
  gives float16 y), so its residual gets a Cast to float16 and its output, unless it writes e4m3 itself, a Cast
  back to the model's dtype;
- the readers read a QuantizeLinear's e4m3 output (float16 Q/DQ models): the producer writes that tensor and the
  QuantizeLinear goes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.rewrites import CannotFuse, Site
from trt_fusedattn.rewrites.conv.qdq import fp8_quantizer_scale

E4M3 = TensorProto.FLOAT8E4M3FN
X, RESIDUAL = 0, 4  # contract input positions
_CHANNEL_MULTIPLE = 16  # e4m3 X: C/G % 16 == 0 (plan_conv)


@dataclass
class _Link:
    """One producer whose output becomes e4m3: its scale, the FusedConvs that read it, QuantizeLinears bypassed."""

    producer: onnx.NodeProto
    scale: float
    readers: list = field(default_factory=list)      # (FusedConv node, its X was float: quantized in the kernel)
    quantizers: list = field(default_factory=list)


class _Graph:
    """What the chain decisions read of the fused model: readers of each tensor, constants, element types."""

    def __init__(self, model: onnx.ModelProto):
        from trt_fusedattn.element_types import element_types

        self.model = model
        self.readers: dict[str, list] = {}
        for node in model.graph.node:
            for index, name in enumerate(node.input):
                if name:
                    self.readers.setdefault(name, []).append((node, index))
        self.outputs = {o.name for o in model.graph.output}
        self.constants = {t.name: t for t in model.graph.initializer}
        self.types = element_types(model)

    def array(self, name: str) -> np.ndarray | None:
        """An initializer's values in its own dtype (float8 as ml_dtypes'); None when ``name`` is not one."""
        tensor = self.constants.get(name)
        return None if tensor is None else numpy_helper.to_array(tensor)

    def channels_per_group(self, conv: onnx.NodeProto) -> int | None:
        """C/G of a 2-D FusedConv (W is [K, kH, kW, C/G]); None for a 1-D one or W that is not a constant."""
        w = self.constants.get(conv.input[1])
        return w.dims[-1] if w is not None and len(w.dims) == 4 else None


def _fp8_reader_scale(graph: _Graph, node: onnx.NodeProto, index: int) -> float:
    """The input scale with which an FP8 FusedConv reads a tensor as X; CannotFuse says why this reader cannot
    take it in e4m3."""
    where = f"{node.op_type} node {node.name}"
    if not FUSED_CONV.is_node(node):
        raise CannotFuse(f"{where} reads it (not a FusedConv)")
    if index == RESIDUAL:
        raise CannotFuse(f"{where} adds it as its residual, in float")
    if index != X:
        raise CannotFuse(f"{where} reads it as {FUSED_CONV.inputs[index].name}")
    attrs = FUSED_CONV.node_attributes(node)
    cg = graph.channels_per_group(node)
    if not attrs["input_scale"]:
        depthwise = cg == 1 and attrs["group"] > 1
        raise CannotFuse(f"{where} is not FP8" + (" (depthwise: no FP8 kernel)" if depthwise else ""))
    if cg is None:
        raise CannotFuse(f"{where} is a 1-D convolution (TensorRT runs it through a Squeeze; kept 16-bit)")
    if cg % _CHANNEL_MULTIPLE:
        raise CannotFuse(f"{where} has C/G = {cg}; e4m3 X needs a multiple of {_CHANNEL_MULTIPLE}")
    return float(np.float32(attrs["input_scale"]))


def _quantizer_scale(graph: _Graph, node: onnx.NodeProto) -> float:
    """The scale of a per-tensor, saturating e4m3 QuantizeLinear whose output only FP8 FusedConvs read as X with
    that scale (then the producer can write its output); CannotFuse otherwise."""
    where = f"QuantizeLinear {node.name or node.output[0]}"
    scale, zero = (graph.array(node.input[i]) if len(node.input) > i else None for i in (1, 2))
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    scale = float(np.float32(fp8_quantizer_scale(node.op_type, where, scale, zero, attrs, None)[0]))
    if node.output[0] in graph.outputs:
        raise CannotFuse(f"{where}'s output is a graph output")
    for reader, index in graph.readers.get(node.output[0], []):
        if _fp8_reader_scale(graph, reader, index) != scale:
            raise CannotFuse(f"{reader.name} reads {where}'s output with another input_scale")
    return scale


def _link(graph: _Graph, producer: onnx.NodeProto) -> _Link:
    """The chain from one FusedConv to its readers, or CannotFuse with the first reason it cannot be one."""
    out = producer.output[0]
    if graph.channels_per_group(producer) is None:
        raise CannotFuse("1-D convolution (TensorRT runs it through a Squeeze; kept 16-bit)")
    if out in graph.outputs:
        raise CannotFuse(f"{out} is a graph output")
    readers = graph.readers.get(out, [])
    if not readers:
        raise CannotFuse(f"{out} is not read")
    link = _Link(producer, 0.0)
    scales = set()
    for node, index in readers:
        if node.op_type == "QuantizeLinear" and node.domain in ("", "ai.onnx") and index == 0:
            scales.add(_quantizer_scale(graph, node))
            link.quantizers.append(node)
        else:
            scales.add(_fp8_reader_scale(graph, node, index))
            link.readers.append(node)
    if len(scales) > 1:
        raise CannotFuse(f"its FP8 readers quantize it with different input scales "
                         f"{', '.join(f'{s:.4g}' for s in sorted(scales))}")
    link.scale = scales.pop()
    return link


def _worth_reporting(graph: _Graph, producer: onnx.NodeProto) -> bool:
    """Whether a refusal says something: the producer is FP8, or some reader of its output is an FP8 FusedConv
    (or an e4m3 QuantizeLinear)."""
    if FUSED_CONV.node_attributes(producer)["input_scale"]:
        return True
    for node, index in graph.readers.get(producer.output[0], []):
        if node.op_type == "QuantizeLinear" or (FUSED_CONV.is_node(node) and index == X
                                                and FUSED_CONV.node_attributes(node)["input_scale"]):
            return True
    return False


def _set_type(model: onnx.ModelProto, name: str, elem_type: int) -> None:
    """Declare tensor ``name``'s element type in value_info (shape kept where known)."""
    for value in model.graph.value_info:
        if value.name == name:
            value.type.tensor_type.elem_type = elem_type
            return
    model.graph.value_info.append(helper.make_tensor_value_info(name, elem_type, None))


def _retype_readers(graph: _Graph, link: _Link, producers: set, before: dict, after: dict) -> None:
    """Casts around readers whose X was float32/bfloat16 and now is e4m3 (their y becomes float16): their residual
    to float16, their output back to its dtype unless they write e4m3 themselves (see module doc). ``before`` and
    ``after`` take the Casts by the reader's output name (unique, unlike node names)."""
    float_x = graph.types.get(link.producer.output[0])
    if float_x in (None, TensorProto.FLOAT16):
        return
    for reader in link.readers:
        if len(reader.input) > RESIDUAL and reader.input[RESIDUAL]:
            residual = reader.input[RESIDUAL]
            cast = f"{residual}_float16_{reader.name}"
            casts = [helper.make_node("Cast", [residual], [cast], name=cast, to=TensorProto.FLOAT16)]
            _set_type(graph.model, cast, TensorProto.FLOAT16)
            reader.input[RESIDUAL] = cast
        else:
            casts = []
        out = reader.output[0]
        if reader.name not in producers:
            reader.output[0] = f"{out}_float16"
            _set_type(graph.model, reader.output[0], TensorProto.FLOAT16)
            after[reader.output[0]] = [helper.make_node("Cast", [reader.output[0]], [out], name=f"{out}_cast_back",
                                                        to=float_x)]
        before[reader.output[0]] = casts


def _apply(graph: _Graph, links: list[_Link]) -> None:
    """Rewrite the model for the chosen links (producers' output_scale, readers' X, Casts, QuantizeLinears)."""
    model = graph.model
    producers = {link.producer.name for link in links}
    before, after, dropped = {}, {}, set()  # by output name (a producer takes its quantizer's: dropped by op type too)
    for link in links:
        _retype_readers(graph, link, producers, before, after)
    for link in links:
        out = link.quantizers[0].output[0] if link.quantizers else link.producer.output[0]
        for quantizer in link.quantizers:
            dropped.add((quantizer.op_type, quantizer.output[0]))
            for reader, index in graph.readers.get(quantizer.output[0], []):
                reader.input[index] = out
        for reader in link.readers:
            reader.input[X] = out
        link.producer.output[0] = out
        link.producer.attribute.append(helper.make_attribute("output_scale", link.scale))
        _set_type(model, out, E4M3)
    nodes = list(model.graph.node)
    del model.graph.node[:]
    for node in nodes:
        key = node.output[0] if node.output else None
        if (node.op_type, key) not in dropped:
            model.graph.node.extend([*before.get(key, []), node, *after.get(key, [])])
    used = {name for node in model.graph.node for name in (*node.input, *node.output)}
    gone = {name for link in links for q in link.quantizers for name in q.input} - used
    for collection in (model.graph.initializer, model.graph.value_info):  # the bypassed quantizers' own tensors
        for item in [t for t in collection if t.name in gone]:
            collection.remove(item)


def chain_fp8(model: onnx.ModelProto, sites: list[Site]) -> list[str]:
    """Make every FusedConv of ``model`` whose output only FP8 FusedConvs read (with one scale) write e4m3 (see
    module doc); each producer site says what happened in ``details["fp8_output"]``. Returns the report notes."""
    convs = [node for node in model.graph.node if FUSED_CONV.is_node(node)]
    if not any(FUSED_CONV.node_attributes(node)["input_scale"] for node in convs):
        return []
    graph = _Graph(model)
    by_node = {site.node: site for site in sites if site.fused}
    links, kept = [], 0
    for producer in convs:
        if FUSED_CONV.node_attributes(producer)["output_scale"]:
            continue
        site = by_node.get(producer.name)
        try:
            links.append(_link(graph, producer))
        except CannotFuse as reason:
            if _worth_reporting(graph, producer):
                kept += 1
                if site is not None:
                    site.details["fp8_output"] = f"no: {reason}"
            continue
        if site is not None:
            site.details["fp8_output"] = (f"e4m3 output_scale={links[-1].scale:.4g}, read by "
                                          f"{len(links[-1].readers) + len(links[-1].quantizers)} FP8 conv input(s)")
    if not links and not kept:
        return []
    _apply(graph, links)
    quantizers = sum(len(link.quantizers) for link in links)
    in_kernel = sum(len(link.readers) for link in links)
    return [f"FP8 chains: {len(links)} FusedConv outputs written in e4m3 by their producers for FP8 readers "
            f"(quantize passes removed: {quantizers} QuantizeLinear, {in_kernel} in-kernel); {kept} outputs of or "
            f"for FP8 convs stay 16-bit (each site's fp8_output detail says why)"]
