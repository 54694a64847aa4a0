"""Conv family: [Pad] Conv [BatchNormalization | per-channel constant Add/Sub/Mul/Div]* [activation]
[Add(residual) [activation]] becomes one ``trt_fusedattn::FusedConv`` node.

Matching follows dataflow from each Conv; every absorbed intermediate must be read only inside the chain (a tensor
used elsewhere ends the chain before it, and the site says where and why in ``details["chain_end"]``). Constant
epilogues fold in float64: BatchNorm and per-channel scales into W, bias and offsets into shift; W is then cast
back to its dtype and stored OHWI. A zero constant Pad read only by the Conv moves into its pads. Activations are
recognised in the forms exporters write (ops, x*f(x) products, the Erf and Tanh GELU decompositions). A Conv the
op cannot express is left alone with one reason.

Residual rule: when both operands of the Add are ends of conv chains (a ResNet projection shortcut), the Conv
later in topological order takes the Add, and the earlier chain's output becomes its residual input.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.rewrites import Site
from trt_fusedattn.rewrites._graph import (constant_value, consumers, folded_value, is_graph_output, is_present,
                                           names_in_use, producer, scalar_value, sole_consumer, unique_name)
from trt_fusedattn.rewrites._shapes import TensorShapes, describe

FAMILY = "conv"
_WEIGHT_DTYPES = ("float32", "float16")  # ONNX Conv types FusedConv takes (Conv has no bfloat16)
_SQRT_HALF = math.sqrt(0.5)
_GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)
_GELU_TANH_CUBIC = 0.044715
# Ops an activation subgraph is built from (each reads the chain's tensor or scalar constants only).
_ELEMENTWISE = {"Mul", "Div", "Add", "Pow", "Erf", "Tanh", "Sigmoid", "HardSigmoid", "HardSwish", "Clip", "Relu",
                "LeakyRelu", "Gelu", "Swish"}
_ACTIVATION_DEPTH = 8  # the longest activation decomposition (gelu_tanh) spans 8 nodes


class _Leave(Exception):
    """A Conv the fused op cannot take; the message is the site's one reason."""


@dataclass(frozen=True)
class _Activation:
    """An activation found in the graph: contract name and parameters, its output, the nodes it spans."""

    name: str
    alpha: float
    beta: float
    out: gs.Variable | None
    nodes: tuple

    def describe(self) -> str:
        params = {"clip": (self.alpha, self.beta), "leaky_relu": (self.alpha,),
                  "hard_sigmoid": (self.alpha, self.beta)}.get(self.name)
        return f"{self.name}({', '.join(f'{p:g}' for p in params)})" if params else self.name


_NO_ACTIVATION = _Activation("none", 0.0, 0.0, None, ())


@dataclass
class _Chain:
    """One matched site: the Conv, its folded constants, and the tensors the fused node reads and writes."""

    conv: gs.Node
    x: gs.Variable
    weight: np.ndarray                      # float64, ONNX layout [K, C/G, *kernel]
    weight_dtype: np.dtype
    shift: np.ndarray | None                # float64 [K]
    conv_attrs: dict
    tail: gs.Variable                       # output before the residual add
    activation: _Activation = _NO_ACTIVATION
    bn_folded: int = 0
    pad: str | None = None                  # Pad before the Conv: None none, "" absorbed, else why it stays
    add: gs.Node | None = None
    residual: gs.Variable | None = None
    post_activation: _Activation = _NO_ACTIVATION
    out: gs.Variable | None = None
    chain_end: str = ""

    def drop_residual(self, why: str) -> None:
        self.add, self.residual, self.post_activation, self.out = None, None, _NO_ACTIVATION, self.tail
        self.chain_end = why


def rewrite(graph: gs.Graph) -> list[Site]:
    """Replace every Conv chain the fused op can express with one FusedConv node; one Site per Conv."""
    graph.toposort()
    convs = [node for node in graph.nodes if node.op == "Conv" and not node.domain]
    if not convs:
        return []
    parameters, left, pads = {}, {}, {}
    for conv in convs:  # first, so that shapes are inferred through the Pads this pass absorbs
        try:
            parameters[id(conv)] = _constant_parameters(conv, graph)
        except _Leave as leave:
            left[id(conv)] = str(leave)
            continue
        pads[id(conv)] = _absorb_pad(conv, parameters[id(conv)][0].ndim, graph)
    shapes = TensorShapes(graph, [t for node in graph.nodes if node.op in ("Conv", "Add")
                                  for t in node.inputs[:2] + node.outputs])
    matched: list[_Chain | Site] = []
    for conv in convs:
        try:
            if id(conv) in left:
                raise _Leave(left[id(conv)])
            matched.append(_match(conv, *parameters[id(conv)], graph, shapes))
            matched[-1].pad = pads[id(conv)]
        except _Leave as leave:
            matched.append(Site(FAMILY, conv.name, False, reason=str(leave),
                                shapes={"X": shapes.report(conv.inputs[0])}))
    _pair_conv_residuals([m for m in matched if isinstance(m, _Chain)],
                         {id(node): i for i, node in enumerate(graph.nodes)})
    taken = names_in_use(graph)
    return [_replace(m, graph, shapes, taken) if isinstance(m, _Chain) else m for m in matched]


def _constant_parameters(conv: gs.Node, graph: gs.Graph) -> tuple[np.ndarray, np.ndarray | None]:
    """The Conv's weights (constant, float, of a 1-D or 2-D convolution FusedConv takes) and bias (float64)."""
    w = conv.inputs[1]
    origin = producer(w)
    if origin is not None and origin.op == "DequantizeLinear":
        raise _Leave("weights are quantized (DequantizeLinear): INT8 Q/DQ convolutions are left to TensorRT")
    weight = folded_value(w, graph)
    if weight is None:
        raise _Leave(f"weights are not constant (W comes from {origin.op if origin else 'a graph input'})")
    if weight.ndim == 5:
        raise _Leave("3-D convolution is not supported (FusedConv is 1-D or 2-D)")
    if weight.ndim not in (3, 4):
        raise _Leave(f"weights of rank {weight.ndim} are not a 1-D or 2-D convolution")
    if weight.dtype.name not in _WEIGHT_DTYPES:
        raise _Leave(f"weights of dtype {weight.dtype} are not supported (float32 or float16 expected)")
    if len(conv.inputs) < 3 or not is_present(conv.inputs[2]):
        return weight, None
    bias = folded_value(conv.inputs[2], graph)
    if bias is None:
        raise _Leave("bias is not constant")
    return weight, bias.astype(np.float64).reshape(-1)


def _match(conv: gs.Node, weight: np.ndarray, shift: np.ndarray | None, graph: gs.Graph,
           shapes: TensorShapes) -> _Chain:
    x = conv.inputs[0]
    chain = _Chain(conv, x, weight.astype(np.float64), weight.dtype, shift,
                   _conv_attributes(conv, weight.shape, shapes.of(x)), conv.outputs[0])
    chain.tail = _fold_constant_epilogue(chain, graph)
    if chain.chain_end:
        return _finish(chain)
    chain.activation = _match_activation(chain.tail, graph) or _NO_ACTIVATION
    chain.tail = chain.activation.out or chain.tail
    _match_residual(chain, graph, shapes)
    return _finish(chain)


def _finish(chain: _Chain) -> _Chain:
    chain.out = chain.out or chain.tail
    return chain


def _auto_pad(conv: gs.Node) -> str:
    value = conv.attrs.get("auto_pad", "NOTSET")
    return value.decode() if isinstance(value, bytes) else value


def _conv_attributes(conv: gs.Node, weight_shape: tuple, x_shape: list | None) -> dict:
    """strides, pads, dilations, group of the Conv, with auto_pad resolved to explicit pads."""
    spatial, kernel = len(weight_shape) - 2, tuple(weight_shape[2:])
    if tuple(conv.attrs.get("kernel_shape", kernel)) != kernel:
        raise _Leave(f"kernel_shape {conv.attrs['kernel_shape']} disagrees with the weights {list(weight_shape)}")
    strides = tuple(conv.attrs.get("strides", (1,) * spatial))
    dilations = tuple(conv.attrs.get("dilations", (1,) * spatial))
    auto_pad = _auto_pad(conv)
    if auto_pad == "NOTSET":
        pads = tuple(conv.attrs.get("pads", (0,) * 2 * spatial))
    elif auto_pad == "VALID":
        pads = (0,) * 2 * spatial
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        sizes = None if x_shape is None else x_shape[2:]
        if sizes is None or len(sizes) != spatial or not all(isinstance(d, int) and d > 0 for d in sizes):
            raise _Leave(f"auto_pad {auto_pad} needs static spatial input dims, X is {describe(x_shape)}")
        begin, end = [], []
        for size, k, s, d in zip(sizes, kernel, strides, dilations):
            total = max(0, (math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            begin.append(small if auto_pad == "SAME_UPPER" else large)
            end.append(large if auto_pad == "SAME_UPPER" else small)
        pads = tuple(begin + end)
    else:
        raise _Leave(f"auto_pad {auto_pad!r} is not an ONNX Conv auto_pad")
    return {"strides": strides, "pads": pads, "dilations": dilations, "group": int(conv.attrs.get("group", 1))}


def _absorb_pad(conv: gs.Node, rank: int, graph: gs.Graph) -> str | None:
    """Move a zero constant-mode Pad of the spatial axes, read only by this Conv, into the Conv's own pads (an
    equivalent Conv; the Pad is removed, its pads' subgraph goes with cleanup). Returns None when no Pad feeds the
    Conv, "" when it was absorbed, else why it stays a node."""
    x, auto_pad = conv.inputs[0], _auto_pad(conv)
    pad = producer(x)
    if pad is None or pad.op != "Pad" or pad.domain:
        return None
    if auto_pad not in ("NOTSET", "VALID"):
        return f"the Conv's auto_pad {auto_pad} depends on the padded size"
    if sole_consumer(x, graph) is not conv:
        return f"{x.name} is read by other nodes too"
    mode = pad.attrs.get("mode", "constant")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant":
        return f"mode {mode} is not zero padding"
    if len(pad.inputs) < 2 or len(pad.inputs) > 3 and is_present(pad.inputs[3]):
        return "pads as an attribute (opset < 11) or with explicit axes are not read"
    amounts = folded_value(pad.inputs[1], graph)
    value = folded_value(pad.inputs[2], graph) if len(pad.inputs) > 2 and is_present(pad.inputs[2]) else 0.0
    if amounts is None:
        return "its pad amounts are not constant (computed from run-time shapes)"
    if value is None or np.any(value):
        return "its pad value is not the constant 0"
    if amounts.size != 2 * rank or (amounts < 0).any() or amounts[:2].any() or amounts[rank:rank + 2].any():
        return f"pads {amounts.tolist()} are not non-negative pads of the spatial axes only"
    spatial = rank - 2
    own = conv.attrs.get("pads", (0,) * 2 * spatial) if auto_pad == "NOTSET" else (0,) * 2 * spatial
    added = list(amounts[2:rank]) + list(amounts[rank + 2:])
    conv.attrs["pads"] = [int(p) + int(a) for p, a in zip(own, added)]
    conv.attrs["auto_pad"] = "NOTSET"
    conv.inputs[0] = pad.inputs[0]
    pad.inputs.clear()  # so that it is nobody's reader while this pass decides on single consumers
    pad.outputs.clear()
    graph.nodes.remove(pad)
    return ""


def _fold_constant_epilogue(chain: _Chain, graph: gs.Graph) -> gs.Variable:
    """Fold what follows the Conv while it is affine per channel: BatchNormalization, and Add, Sub, Mul, Div by a
    per-channel constant (scales into W, offsets into shift). Returns the tensor reached."""
    tensor = chain.tail
    while True:
        node = sole_consumer(tensor, graph)
        if node is None:  # read by several nodes: maybe an x * f(x) activation, which the caller matches next
            return tensor
        if node.op == "BatchNormalization" and not node.domain and node.inputs[0] is tensor:
            why = _fold_batch_norm(chain, node, graph)
            if why:
                chain.chain_end = why
                return tensor
        elif not _fold_per_channel_arithmetic(chain, node, tensor, graph):
            return tensor
        tensor = node.outputs[0]


def _fold_per_channel_arithmetic(chain: _Chain, node: gs.Node, tensor: gs.Variable, graph: gs.Graph) -> bool:
    """Fold y+c, c+y, y-c, y*c, c*y, y/c (c a per-channel constant) into W and shift; whether it did."""
    if node.domain or node.op not in ("Add", "Sub", "Mul", "Div") or len(node.inputs) != 2 \
            or (node.op in ("Sub", "Div") and node.inputs[0] is not tensor):
        return False
    value = _per_channel(folded_value(_other_operand(node, tensor), graph), chain.weight.shape[0], chain.weight.ndim)
    if value is None or (node.op == "Div" and not np.all(value)):
        return False
    if node.op in ("Add", "Sub"):
        offset = value if node.op == "Add" else -value
        chain.shift = offset if chain.shift is None else chain.shift + offset
    else:
        factor = value if node.op == "Mul" else 1.0 / value
        chain.weight = chain.weight * factor.reshape((-1,) + (1,) * (chain.weight.ndim - 1))
        chain.shift = None if chain.shift is None else chain.shift * factor
    return True


def _fold_batch_norm(chain: _Chain, bn: gs.Node, graph: gs.Graph) -> str:
    """Fold an inference-form BatchNormalization into W and shift; the reason it cannot be folded, or ''."""
    if int(bn.attrs.get("training_mode", 0)) or any(consumers(out) for out in bn.outputs[1:]):
        return f"BatchNormalization {bn.name} is in training form (its running statistics are outputs)"
    params = [folded_value(t, graph) for t in bn.inputs[1:5]]
    if any(p is None for p in params):
        return f"BatchNormalization {bn.name} has non-constant parameters"
    channels = chain.weight.shape[0]
    gamma, beta, mean, var = (np.asarray(p, np.float64).reshape(-1) for p in params)
    if not all(p.size == channels for p in (gamma, beta, mean, var)):
        return f"BatchNormalization {bn.name} parameters do not have the Conv's {channels} channels"
    factor = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    chain.weight = chain.weight * factor.reshape((-1,) + (1,) * (chain.weight.ndim - 1))
    chain.shift = ((0.0 if chain.shift is None else chain.shift) - mean) * factor + beta
    chain.bn_folded += 1
    return ""


def _per_channel(value: np.ndarray | None, channels: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts over a rank-``rank`` [N, K, ...] output as one value per channel, as float64
    [K]; None for anything else."""
    if value is None or value.dtype.name not in _WEIGHT_DTYPES + ("float64",) or value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if shape[0] != 1 or shape[1] not in (1, channels) or any(d != 1 for d in shape[2:]):
        return None
    return np.broadcast_to(value.astype(np.float64).reshape(-1), (channels,)).copy()


def _other_operand(node: gs.Node, tensor: gs.Tensor) -> gs.Tensor | None:
    """The input of a two-input node that is not ``tensor`` (None when both are)."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    return b if a is tensor and b is not tensor else a if b is tensor and a is not tensor else None


def _used_elsewhere(tensor: gs.Tensor, graph: gs.Graph) -> str:
    if is_graph_output(tensor, graph):
        return f"{tensor.name} is a graph output"
    readers = consumers(tensor)
    return f"{tensor.name} is read by {len(readers)} nodes" if len(readers) > 1 else ""


def _match_residual(chain: _Chain, graph: gs.Graph, shapes: TensorShapes) -> None:
    add = sole_consumer(chain.tail, graph)
    if add is None:
        chain.chain_end = _used_elsewhere(chain.tail, graph)
        return
    if add.op != "Add" or add.domain:
        return
    other = _other_operand(add, chain.tail)
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
    chain.post_activation = _match_activation(chain.out, graph) or _NO_ACTIVATION
    chain.out = chain.post_activation.out or chain.out


def _pair_conv_residuals(chains: list[_Chain], order: dict) -> None:
    """Where one Add joins two conv chains, the later Conv (topological order) keeps it; the earlier one's output
    becomes the residual."""
    by_add: dict[int, list[_Chain]] = {}
    for chain in chains:
        if chain.add is not None:
            by_add.setdefault(id(chain.add), []).append(chain)
    for pair in by_add.values():
        if len(pair) == 2:
            earlier, later = sorted(pair, key=lambda c: order[id(c.conv)])
            earlier.drop_residual(f"{later.add.name} is taken by {later.conv.name}, which reads this output as "
                                  f"its residual")


def _replace(chain: _Chain, graph: gs.Graph, shapes: TensorShapes, taken: set) -> Site:
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
    return Site(FAMILY, chain.conv.name, True, op=FUSED_CONV.qualified_name, node=name,
                shapes={"X": shapes.report(chain.x), "W": list(weight.values.shape), "Y": shapes.report(out)},
                details=details)


# ---- activations --------------------------------------------------------------------------------------------------

def _match_activation(tensor: gs.Variable, graph: gs.Graph) -> _Activation | None:
    """The activation that reads all of ``tensor`` (and nothing else reads its insides), in any exporter's form."""
    if is_graph_output(tensor, graph) or not consumers(tensor):
        return None
    for end in _reachable_ends(tensor):
        for matcher in (_unary_activation, _product_activation):
            found = matcher(end, tensor)
            if found is not None and _is_closed(found, tensor, graph):
                return found
    return None


def _reachable_ends(tensor: gs.Variable) -> list[gs.Variable]:
    """Outputs of elementwise nodes reachable from ``tensor``, the farthest first (so the longest form wins)."""
    depth, frontier = {}, [tensor]
    for level in range(1, _ACTIVATION_DEPTH + 1):
        next_frontier = []
        for t in frontier:
            for node in consumers(t):
                if node.op in _ELEMENTWISE and not node.domain and len(node.outputs) == 1:
                    out = node.outputs[0]
                    if id(out) not in depth:
                        depth[id(out)] = (level, out)
                        next_frontier.append(out)
        frontier = next_frontier
    return [out for _, out in sorted(depth.values(), key=lambda item: -item[0])]


def _is_closed(act: _Activation, tensor: gs.Variable, graph: gs.Graph) -> bool:
    """Whether every reader of ``tensor`` and of each inner tensor of ``act`` lies inside ``act``."""
    inside = {id(node) for node in act.nodes}
    if any(id(node) not in inside for node in consumers(tensor)):
        return False
    for node in act.nodes:
        for out in node.outputs:
            if out is not act.out and (is_graph_output(out, graph) or
                                       any(id(reader) not in inside for reader in consumers(out))):
                return False
    return True


def _close(value: float | None, expected: float) -> bool:
    return value is not None and abs(value - expected) <= 2e-3 * max(1.0, abs(expected))


def _unary_activation(end: gs.Variable, x: gs.Variable) -> _Activation | None:
    """One ONNX activation op applied to ``x``."""
    node = producer(end)
    if node is None or not node.inputs or node.inputs[0] is not x:
        return None
    op, attrs = node.op, node.attrs
    simple = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "HardSwish": "hard_swish"}
    if op in simple:
        return _Activation(simple[op], 0.0, 0.0, end, (node,))
    if op == "LeakyRelu":
        return _Activation("leaky_relu", float(attrs.get("alpha", 0.01)), 0.0, end, (node,))
    if op == "HardSigmoid":
        return _Activation("hard_sigmoid", float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5)), end, (node,))
    if op == "Swish" and _close(float(attrs.get("alpha", 1.0)), 1.0):
        return _Activation("silu", 0.0, 0.0, end, (node,))
    if op == "Gelu":
        approximate = attrs.get("approximate", "none")
        approximate = approximate.decode() if isinstance(approximate, bytes) else approximate
        return _Activation("gelu" if approximate == "none" else "gelu_tanh", 0.0, 0.0, end, (node,))
    if op == "Clip":
        bounds = _clip_bounds(node)
        if bounds is None:
            return None
        low, high = bounds
        if low == 0.0 and high == math.inf:
            return _Activation("relu", 0.0, 0.0, end, (node,))
        return _Activation("clip", low, high, end, (node,))
    return None


def _clip_bounds(node: gs.Node) -> tuple[float, float] | None:
    """(min, max) of a Clip with constant bounds, attributes (opset < 11) or inputs; missing bounds are infinite."""
    if "min" in node.attrs or "max" in node.attrs:
        return float(node.attrs.get("min", -math.inf)), float(node.attrs.get("max", math.inf))
    bounds = []
    for index, missing in ((1, -math.inf), (2, math.inf)):
        if len(node.inputs) > index and is_present(node.inputs[index]):
            value = scalar_value(node.inputs[index])
            if value is None:
                return None
            bounds.append(value)
        else:
            bounds.append(missing)
    return bounds[0], bounds[1]


def _product(tensor: gs.Tensor, x: gs.Variable, top: bool = True) -> tuple[float, list, list]:
    """``tensor`` as coefficient * product of factors, expanding Mul, Div by a constant and Pow by 2 or 3 through
    tensors read once; ``x`` is never expanded. Returns (coefficient, factor tensors, nodes expanded)."""
    node = producer(tensor)
    if tensor is x or node is None or node.domain or (not top and len(consumers(tensor)) != 1):
        return 1.0, [tensor], []
    a, b = (node.inputs + [None, None])[:2]
    if node.op == "Mul":
        for const, other in ((scalar_value(a), b), (scalar_value(b), a)):
            if const is not None:
                coef, factors, nodes = _product(other, x, False)
                return const * coef, factors, nodes + [node]
        ca, fa, na = _product(a, x, False)
        cb, fb, nb = _product(b, x, False) if b is not a else (ca, fa, [])
        return ca * cb, fa + fb, na + nb + [node]
    if node.op == "Div" and scalar_value(b):
        coef, factors, nodes = _product(a, x, False)
        return coef / scalar_value(b), factors, nodes + [node]
    if node.op == "Pow" and scalar_value(b) in (2.0, 3.0):
        power = int(scalar_value(b))
        coef, factors, nodes = _product(a, x, False)
        return coef ** power, factors * power, nodes + [node]
    return 1.0, [tensor], []


def _add_constant(tensor: gs.Tensor) -> tuple[float, gs.Tensor, gs.Node] | None:
    """(c, y, node) when ``tensor`` is Add(y, c) or Add(c, y) with a scalar constant c."""
    node = producer(tensor)
    if node is None or node.op != "Add" or node.domain or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    for const, other in ((scalar_value(b), a), (scalar_value(a), b)):
        if const is not None:
            return const, other, node
    return None


def _product_activation(end: gs.Variable, x: gs.Variable) -> _Activation | None:
    """x * f(x) forms: silu, hard_swish (x*HardSigmoid(x), x*Relu6(x+3)/6), gelu (erf) and gelu_tanh as exported."""
    if producer(end) is None or producer(end).op not in ("Mul", "Div"):
        return None
    coef, factors, nodes = _product(end, x)
    if len(factors) != 2 or sum(f is x for f in factors) != 1:
        return None
    gate = factors[1] if factors[0] is x else factors[0]
    gate_node = producer(gate)
    if gate_node is None:
        return None
    found = _gate_activation(gate_node, x, coef)
    if found is None:
        return None
    name, gate_nodes = found
    return _Activation(name, 0.0, 0.0, end, tuple(nodes + gate_nodes))


def _gate_activation(gate: gs.Node, x: gs.Variable, coef: float) -> tuple[str, list] | None:
    """The activation x * coef * gate(x) is, with the gate's nodes, or None."""
    if gate.op == "Sigmoid" and gate.inputs[0] is x and _close(coef, 1.0):
        return "silu", [gate]
    if gate.op == "HardSigmoid" and gate.inputs[0] is x and _close(coef, 1.0) and \
            _close(float(gate.attrs.get("alpha", 0.2)), 1 / 6) and _close(float(gate.attrs.get("beta", 0.5)), 0.5):
        return "hard_swish", [gate]
    if gate.op == "Clip" and _close(coef, 1 / 6) and _clip_bounds(gate) == (0.0, 6.0):
        shifted = _add_constant(gate.inputs[0])
        if shifted is not None and shifted[1] is x and _close(shifted[0], 3.0):
            return "hard_swish", [gate, shifted[2]]
        return None
    one_plus = _add_constant(gate.outputs[0])
    if one_plus is None or not _close(one_plus[0], 1.0) or not _close(coef, 0.5):
        return None
    inner = producer(one_plus[1])
    if inner is None or inner.op not in ("Erf", "Tanh"):
        return None
    scale, factors, nodes = _product(inner.inputs[0], x, False)
    if inner.op == "Erf" and factors == [x] and _close(scale, _SQRT_HALF):
        return "gelu", [gate, inner] + nodes
    if inner.op == "Tanh" and len(factors) == 1 and _close(scale, _GELU_TANH_SCALE):
        cubic = _add_cubic(factors[0], x)
        if cubic is not None:
            return "gelu_tanh", [gate, inner] + nodes + cubic
    return None


def _add_cubic(tensor: gs.Tensor, x: gs.Variable) -> list | None:
    """The nodes of x + 0.044715 * x^3 (either Add order, x^3 as Pow or products), or None."""
    node = producer(tensor)
    if node is None or node.op != "Add" or node.domain or len(consumers(tensor)) != 1:
        return None
    other = _other_operand(node, x)
    if other is None:
        return None
    coef, factors, nodes = _product(other, x, False)
    if len(factors) == 3 and all(f is x for f in factors) and _close(coef, _GELU_TANH_CUBIC):
        return [node] + nodes
    return None
