"""Conv family: [Pad] Conv [BatchNormalization | per-channel constant Add/Sub/Mul/Div]* [activation]
[Add(residual) [activation]] becomes one ``trt_fusedattn::FusedConv`` node.

Matching follows dataflow from each Conv; every absorbed intermediate must be read only inside the chain (a tensor
used elsewhere ends the chain before it, and the site says where and why in ``details["chain_end"]``). Constant
epilogues fold in float64 (``epilogue``): BatchNorm and per-channel scales into W, bias and offsets into shift; W
is then cast back to its dtype and stored OHWI. A zero constant Pad read only by the Conv moves into its pads
(``pad``). Activations are recognised in the forms exporters write (``activation``). A Conv the op cannot express
is left alone with one reason.

Residual rule: when both operands of the Add are ends of conv chains (a ResNet projection shortcut), the Conv
later in topological order takes the Add, and the earlier chain's output becomes its residual input.
"""
from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.rewrites import CannotFuse, Site
from trt_fusedattn.rewrites._graph import (attribute_text, constant_value, consumers, folded_value, is_graph_output,
                                           is_op, is_present, names_in_use, other_operand, producer, sole_consumer,
                                           unique_name)
from trt_fusedattn.rewrites._shapes import TensorShapes, describe
from trt_fusedattn.rewrites.conv.activation import NO_ACTIVATION, match_activation
from trt_fusedattn.rewrites.conv.choice import leave_to_tensorrt
from trt_fusedattn.rewrites.conv.epilogue import WEIGHT_DTYPES, Chain, fold_constant_epilogue
from trt_fusedattn.rewrites.conv.pad import absorb_pad

FAMILY = "conv"


def rewrite(graph: gs.Graph, target: str | None = None, precision: str | None = None) -> list[Site]:
    """Replace every Conv chain the fused op can express with one FusedConv node; one Site per Conv. ``target``
    (a GPU arch): a chain TensorRT's own fused conv runs faster there is left unfused (``choice``); ``precision``
    ("fp8" or not) says which of our kernels that comparison is for."""
    graph.toposort()
    convs = [node for node in graph.nodes if is_op(node, "Conv")]
    if not convs:
        return []
    parameters, left, pads = {}, {}, {}
    for conv in convs:  # first, so that shapes are inferred through the Pads this pass absorbs
        try:
            parameters[id(conv)] = _constant_parameters(conv, graph)
        except CannotFuse as reason:
            left[id(conv)] = str(reason)
            continue
        pads[id(conv)] = absorb_pad(conv, parameters[id(conv)][0].ndim, graph)
    shapes = TensorShapes(graph, [t for node in graph.nodes if node.op in ("Conv", "Add")
                                  for t in node.inputs[:2] + node.outputs])
    matched: list[Chain | Site] = []
    for conv in convs:
        try:
            if id(conv) in left:
                raise CannotFuse(left[id(conv)])
            matched.append(_match(conv, *parameters[id(conv)], graph, shapes))
            matched[-1].pad = pads[id(conv)]
        except CannotFuse as reason:
            matched.append(Site(FAMILY, conv.name, False, reason=str(reason),
                                shapes={"X": shapes.report(conv.inputs[0])}))
    if target is not None:  # before pairing: an Add whose other chain is left to TensorRT stays with this one
        matched = [leave_to_tensorrt(m, target, precision, shapes) if isinstance(m, Chain) else m for m in matched]
    _pair_conv_residuals([m for m in matched if isinstance(m, Chain)],
                         {id(node): i for i, node in enumerate(graph.nodes)})
    taken = names_in_use(graph)
    return [_replace(m, graph, shapes, taken) if isinstance(m, Chain) else m for m in matched]


def _constant_parameters(conv: gs.Node, graph: gs.Graph) -> tuple[np.ndarray, np.ndarray | None]:
    """The Conv's weights (constant, float, of a 1-D or 2-D convolution FusedConv takes) and bias (float64)."""
    w = conv.inputs[1]
    origin = producer(w)
    if origin is not None and origin.op == "DequantizeLinear":
        raise CannotFuse("weights are quantized (DequantizeLinear): INT8 Q/DQ convolutions are left to TensorRT")
    weight = folded_value(w, graph)
    if weight is None:
        raise CannotFuse(f"weights are not constant (W comes from {origin.op if origin else 'a graph input'})")
    if weight.ndim == 5:
        raise CannotFuse("3-D convolution is not supported (FusedConv is 1-D or 2-D)")
    if weight.ndim not in (3, 4):
        raise CannotFuse(f"weights of rank {weight.ndim} are not a 1-D or 2-D convolution")
    if weight.dtype.name not in WEIGHT_DTYPES:
        raise CannotFuse(f"weights of dtype {weight.dtype} are not supported (float32 or float16 expected)")
    if len(conv.inputs) < 3 or not is_present(conv.inputs[2]):
        return weight, None
    bias = folded_value(conv.inputs[2], graph)
    if bias is None:
        raise CannotFuse("bias is not constant")
    return weight, bias.astype(np.float64).reshape(-1)


def _match(conv: gs.Node, weight: np.ndarray, shift: np.ndarray | None, graph: gs.Graph,
           shapes: TensorShapes) -> Chain:
    x = conv.inputs[0]
    chain = Chain(conv, x, weight.astype(np.float64), weight.dtype, shift,
                  _conv_attributes(conv, weight.shape, shapes.of(x)), conv.outputs[0])
    chain.tail = fold_constant_epilogue(chain, graph)
    if chain.chain_end:
        return _finish(chain)
    chain.activation = match_activation(chain.tail, graph) or NO_ACTIVATION
    chain.tail = chain.activation.out or chain.tail
    _match_residual(chain, graph, shapes)
    return _finish(chain)


def _finish(chain: Chain) -> Chain:
    chain.out = chain.out or chain.tail
    return chain


def _conv_attributes(conv: gs.Node, weight_shape: tuple, x_shape: list | None) -> dict:
    """strides, pads, dilations, group of the Conv, with auto_pad resolved to explicit pads."""
    spatial, kernel = len(weight_shape) - 2, tuple(weight_shape[2:])
    if tuple(conv.attrs.get("kernel_shape", kernel)) != kernel:
        raise CannotFuse(f"kernel_shape {conv.attrs['kernel_shape']} disagrees with the weights {list(weight_shape)}")
    strides = tuple(conv.attrs.get("strides", (1,) * spatial))
    dilations = tuple(conv.attrs.get("dilations", (1,) * spatial))
    auto_pad = attribute_text(conv, "auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = tuple(conv.attrs.get("pads", (0,) * 2 * spatial))
    elif auto_pad == "VALID":
        pads = (0,) * 2 * spatial
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        sizes = None if x_shape is None else x_shape[2:]
        if sizes is None or len(sizes) != spatial or not all(isinstance(d, int) and d > 0 for d in sizes):
            raise CannotFuse(f"auto_pad {auto_pad} needs static spatial input dims, X is {describe(x_shape)}")
        begin, end = [], []
        for size, k, s, d in zip(sizes, kernel, strides, dilations):
            total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else large)
            end.append(large if auto_pad == "SAME_UPPER" else small)
        pads = tuple(begin + end)
    else:
        raise CannotFuse(f"auto_pad {auto_pad!r} is not an ONNX Conv auto_pad")
    return {"strides": strides, "pads": pads, "dilations": dilations, "group": int(conv.attrs.get("group", 1))}


def _used_elsewhere(tensor: gs.Tensor, graph: gs.Graph) -> str:
    if is_graph_output(tensor, graph):
        return f"{tensor.name} is a graph output"
    readers = consumers(tensor)
    return f"{tensor.name} is read by {len(readers)} nodes" if len(readers) > 1 else ""


def _match_residual(chain: Chain, graph: gs.Graph, shapes: TensorShapes) -> None:
    add = sole_consumer(chain.tail, graph)
    if add is None:
        chain.chain_end = _used_elsewhere(chain.tail, graph)
        return
    if not is_op(add, "Add"):
        return
    other = other_operand(add, chain.tail)
    if other is None:
        chain.chain_end = f"{add.name} adds {chain.tail.name} to itself"
        return
    if constant_value(other) is not None:
        chain.chain_end = f"{add.name} adds a constant that cannot fold into shift (after the activation, or not " \
                          f"per channel)"
        return
    if not shapes.same(chain.tail, other):
        chain.chain_end = f"{add.name}'s other operand {other.name} {shapes.report(other)} is not provably of the " \
                          f"output's shape {shapes.report(chain.tail)}"
        return
    chain.add, chain.residual, chain.out = add, other, add.outputs[0]
    chain.post_activation = match_activation(chain.out, graph) or NO_ACTIVATION
    chain.out = chain.post_activation.out or chain.out


def _pair_conv_residuals(chains: list[Chain], order: dict) -> None:
    """Where one Add joins two conv chains, the later Conv (topological order) keeps it; the earlier one's output
    becomes the residual."""
    by_add: dict[int, list[Chain]] = {}
    for chain in chains:
        if chain.add is not None:
            by_add.setdefault(id(chain.add), []).append(chain)
    for pair in by_add.values():
        if len(pair) == 2:
            earlier, later = sorted(pair, key=lambda c: order[id(c.conv)])
            earlier.drop_residual(f"{later.add.name} is taken by {later.conv.name}, which reads this output as "
                                  f"its residual")


def _replace(chain: Chain, graph: gs.Graph, shapes: TensorShapes, taken: set) -> Site:
    """Emit the FusedConv node writing the chain's output; the bypassed nodes go with the driver's cleanup."""
    name = unique_name(f"{chain.conv.name}_FusedConv", taken)
    perm = (0, *range(2, chain.weight.ndim), 1)
    weight = gs.Constant(unique_name(f"{name}.W", taken),
                         np.ascontiguousarray(chain.weight.transpose(perm)).astype(chain.weight_dtype))
    inputs = [chain.x, weight, gs.Variable.empty(), gs.Variable.empty()]
    if chain.shift is not None:
        inputs[2] = gs.Constant(unique_name(f"{name}.shift", taken), chain.shift.astype(np.float32))
    if chain.residual is not None:
        inputs.append(chain.residual)
    while not is_present(inputs[-1]):
        inputs.pop()
    attrs = dict(chain.conv_attrs, activation=chain.activation.name, post_activation=chain.post_activation.name)
    for prefix, act in (("activation", chain.activation), ("post_activation", chain.post_activation)):
        if act.name in ("clip", "leaky_relu", "hard_sigmoid"):
            attrs[f"{prefix}_alpha"] = act.alpha
        if act.name in ("clip", "hard_sigmoid"):
            attrs[f"{prefix}_beta"] = act.beta
    out = chain.out
    out.inputs.clear()
    graph.nodes.append(gs.Node(op=FUSED_CONV.name, domain=FUSED_CONV.domain, name=name, inputs=inputs,
                               outputs=[out], attrs=FUSED_CONV.explicit_attributes(**attrs)))
    details = {"activation": chain.activation.describe(), "bn_folded": chain.bn_folded,
               "bias": chain.shift is not None, "pad_folded": chain.pad == "",
               "residual": chain.residual.name if chain.residual is not None else "",
               "post_activation": chain.post_activation.describe()}
    if chain.pad:
        details["pad_kept"] = chain.pad
    if chain.chain_end:
        details["chain_end"] = chain.chain_end
    if chain.choice is not None:
        details["faster_than_tensorrt"] = f"{chain.choice.arch}: {chain.choice.evidence}"
    return Site(FAMILY, chain.conv.name, True, op=FUSED_CONV.qualified_name, node=name,
                shapes={"X": shapes.report(chain.x), "W": list(weight.values.shape), "Y": shapes.report(out)},
                details=details)
