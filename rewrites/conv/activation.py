"""Activations after a convolution, recognised in the forms exporters write: single ops (Relu, Clip, HardSwish,
Gelu, ...), x*f(x) products (silu, hard_swish), and the Erf and Tanh GELU decompositions.

``match_activation`` returns the activation reading all of a tensor, as FusedConv's contract names it, with the
nodes it spans (nothing outside it may read their insides)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import onnx_graphsurgeon as gs

from trt_fusedattn.rewrites._graph import (attribute_text, consumers, is_graph_output, is_op, is_present, is_standard,
                                           other_operand, producer, scalar_value)

_SQRT_HALF = math.sqrt(0.5)
_GELU_TANH_SCALE = math.sqrt(2.0 / math.pi)
_GELU_TANH_CUBIC = 0.044715
# Ops an activation subgraph is built from (each reads the chain's tensor or scalar constants only).
_ELEMENTWISE = {"Mul", "Div", "Add", "Pow", "Erf", "Tanh", "Sigmoid", "HardSigmoid", "HardSwish", "Clip", "Relu",
                "LeakyRelu", "Gelu", "Swish"}
_ACTIVATION_DEPTH = 8  # the longest activation decomposition (gelu_tanh) spans 8 nodes


@dataclass(frozen=True)
class Activation:
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


NO_ACTIVATION = Activation("none", 0.0, 0.0, None, ())


def match_activation(tensor: gs.Variable, graph: gs.Graph) -> Activation | None:
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
                if node.op in _ELEMENTWISE and is_standard(node) and len(node.outputs) == 1:
                    out = node.outputs[0]
                    if id(out) not in depth:
                        depth[id(out)] = (level, out)
                        next_frontier.append(out)
        frontier = next_frontier
    return [out for _, out in sorted(depth.values(), key=lambda item: -item[0])]


def _is_closed(act: Activation, tensor: gs.Variable, graph: gs.Graph) -> bool:
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


def _unary_activation(end: gs.Variable, x: gs.Variable) -> Activation | None:
    """One ONNX activation op applied to ``x``."""
    node = producer(end)
    if node is None or not node.inputs or node.inputs[0] is not x:
        return None
    op, attrs = node.op, node.attrs
    simple = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "HardSwish": "hard_swish"}
    if op in simple:
        return Activation(simple[op], 0.0, 0.0, end, (node,))
    if op == "LeakyRelu":
        return Activation("leaky_relu", float(attrs.get("alpha", 0.01)), 0.0, end, (node,))
    if op == "HardSigmoid":
        return Activation("hard_sigmoid", float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5)), end, (node,))
    if op == "Swish" and _close(float(attrs.get("alpha", 1.0)), 1.0):
        return Activation("silu", 0.0, 0.0, end, (node,))
    if op == "Gelu":
        approximate = attribute_text(node, "approximate", "none")
        return Activation("gelu" if approximate == "none" else "gelu_tanh", 0.0, 0.0, end, (node,))
    if op == "Clip":
        bounds = _clip_bounds(node)
        if bounds is None:
            return None
        low, high = bounds
        if low == 0.0 and high == math.inf:
            return Activation("relu", 0.0, 0.0, end, (node,))
        return Activation("clip", low, high, end, (node,))
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
    if tensor is x or not is_standard(node) or (not top and len(consumers(tensor)) != 1):
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
    if not is_op(node, "Add") or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    for const, other in ((scalar_value(b), a), (scalar_value(a), b)):
        if const is not None:
            return const, other, node
    return None


def _product_activation(end: gs.Variable, x: gs.Variable) -> Activation | None:
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
    return Activation(name, 0.0, 0.0, end, tuple(nodes + gate_nodes))


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
    if not is_op(node, "Add") or len(consumers(tensor)) != 1:
        return None
    other = other_operand(node, x)
    if other is None:
        return None
    coef, factors, nodes = _product(other, x, False)
    if len(factors) == 3 and all(f is x for f in factors) and _close(coef, _GELU_TANH_CUBIC):
        return [node] + nodes
    return None
