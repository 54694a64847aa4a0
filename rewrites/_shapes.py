"""Tensor shapes a rewrite can rely on: recorded or inferred by ONNX, and derived symbolically through
convolutions, pools and elementwise ops so that two dynamic shapes can be proved equal (a residual Add of a
model exported with dynamic height and width)."""
from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_graphsurgeon as gs

from trt_fusedattn.rewrites._graph import constant_value, producer

# Ops whose first output has the shape of their first input.
_SHAPE_PRESERVING = {
    "Abs", "BatchNormalization", "Cast", "Clip", "Dropout", "Elu", "Erf", "Exp", "Gelu", "HardSigmoid", "HardSwish",
    "Identity", "InstanceNormalization", "LayerNormalization", "LeakyRelu", "Log", "Mish", "Neg", "Relu", "Selu",
    "Sigmoid", "Softmax", "Softplus", "Sqrt", "Swish", "Tanh",
}
_BROADCASTING = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"}
_WINDOWED = {"Conv", "MaxPool", "AveragePool"}


@dataclass(frozen=True)
class FloorDim:
    """``floor((symbol + offset) / divisor)``: a dynamic input dim after strided windows (convolutions, pools).

    Nested windows compose exactly (floor(floor(y / a) / b) = floor(y / ab)), so equal triples are equal dims."""

    symbol: str
    offset: int = 0
    divisor: int = 1

    def window(self, add: int, stride: int) -> FloorDim:
        """``floor((self + add) / stride)``."""
        return FloorDim(self.symbol, self.offset + add * self.divisor, self.divisor * stride)

    def __str__(self) -> str:
        inner = f"{self.symbol}{self.offset:+d}" if self.offset else self.symbol
        return inner if self.divisor == 1 else f"({inner})//{self.divisor}"


def describe(dims: list | None) -> list | None:
    """Dims as reports show them: ints, symbolic dims as text, None where unknown."""
    return None if dims is None else [str(d) if isinstance(d, FloorDim) else d for d in dims]


def _window(dim, add: int, stride: int):
    if isinstance(dim, int):
        return (dim + add) // stride
    return dim.window(add, stride) if isinstance(dim, FloorDim) else None


class TensorShapes:
    """Shapes of one graph's tensors: ``of`` for proofs (dims int, FloorDim or None), ``report`` for Sites."""

    def __init__(self, graph: gs.Graph, wanted: list[gs.Tensor]):
        self.recorded = tensor_shapes(graph, wanted)
        self._derived: dict[str, list] = {}
        for node in graph.nodes:  # topological order: inputs are derived before the nodes that read them
            dims = self._derive(node)
            if dims is not None and node.outputs:
                self._derived[node.outputs[0].name] = dims

    def of(self, tensor: gs.Tensor) -> list | None:
        """The tensor's dims: derived where derivable in full (exporters' own annotations can be wrong), else as
        recorded or inferred, with symbolic names as FloorDims."""
        derived = self._derived.get(tensor.name)
        if derived is not None and None not in derived:
            return derived
        recorded = self.recorded.get(tensor.name)
        if recorded is None:
            return derived
        return [FloorDim(d) if isinstance(d, str) else d for d in recorded]

    def report(self, tensor: gs.Tensor) -> list | None:
        """The dims as a Site shows them (``describe``)."""
        return describe(self.of(tensor))

    def same(self, a: gs.Tensor, b: gs.Tensor) -> bool:
        """Whether the two tensors provably have one shape."""
        return same_shape(self.of(a), self.of(b))

    def _derive(self, node: gs.Node) -> list | None:
        if node.domain or not node.inputs:
            return None
        if node.op in _SHAPE_PRESERVING:
            return self.of(node.inputs[0])
        if node.op in _WINDOWED:
            return self._windowed(node)
        if node.op in _BROADCASTING and len(node.inputs) == 2:
            return self._broadcast(*node.inputs)
        return None

    def _windowed(self, node: gs.Node) -> list | None:
        x = self.of(node.inputs[0])
        if node.op == "Conv":
            weight = constant_value(node.inputs[1])
            if weight is None:
                return None
            channels, kernel = weight.shape[0], weight.shape[2:]
        else:
            if int(node.attrs.get("ceil_mode", 0)) or len(node.outputs) > 1:
                return None  # ceil mode's last-window rule, and MaxPool's indices output: not derived
            channels, kernel = (x[1] if x else None), tuple(node.attrs.get("kernel_shape", ()))
        spatial = len(kernel)
        if x is None or len(x) != spatial + 2:
            return None
        strides = node.attrs.get("strides", (1,) * spatial)
        dilations = node.attrs.get("dilations", (1,) * spatial)
        auto_pad = node.attrs.get("auto_pad", "NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        pads = node.attrs.get("pads", (0,) * 2 * spatial) if auto_pad == "NOTSET" else (0,) * 2 * spatial
        out = []
        for i, (dim, k, s, d) in enumerate(zip(x[2:], kernel, strides, dilations)):
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                out.append(_window(dim, s - 1, s))  # ceil(dim / s)
            else:  # floor((dim + pads - d(k-1) - 1) / s) + 1
                out.append(_window(dim, pads[i] + pads[i + spatial] - d * (k - 1) - 1 + s, s))
        return [x[0], channels, *out]

    def _broadcast(self, a: gs.Tensor, b: gs.Tensor) -> list | None:
        """The shape of a broadcasting binary op, where one operand's shape provably contains the other's."""
        for big, small in ((a, b), (b, a)):
            small_value = constant_value(small)
            if small_value is not None:
                dims = self.of(big)
                fits = dims is not None and small_value.ndim <= len(dims) and all(
                    s == 1 or s == d for s, d in zip(small_value.shape[::-1], dims[::-1]))
                return dims if fits else None
        dims = self.of(a)
        return dims if same_shape(dims, self.of(b)) else None


def tensor_shapes(graph: gs.Graph, wanted: list[gs.Tensor]) -> dict[str, list]:
    """Shapes of the graph's tensors by name: those the graph records, completed by onnx shape inference.

    Dims are ints, symbolic names (str), or None where unknown (inference's own ``unk__`` names count as
    unknown). Inference runs on an exported copy, only when a ``wanted`` variable's shape is not fully known;
    per tensor the better known of recorded and inferred shape wins. A model inference fails on keeps what it has."""
    shapes = {name: _known_dims(t.shape) for name, t in graph.tensors().items() if t.shape is not None}
    if all(t.name in shapes and None not in shapes[t.name] for t in wanted
           if isinstance(t, gs.Variable) and not t.is_empty()):
        return shapes
    try:
        model = gs.export_onnx(graph, do_type_check=False)
        del model.graph.value_info[:]  # stale shapes from before this pass's edits must not pin inference
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is a best effort; sites then report the unknown shape
        return shapes
    for info in list(model.graph.value_info) + list(model.graph.output):
        if not info.type.tensor_type.HasField("shape"):
            continue
        inferred = _known_dims([d.dim_value if d.HasField("dim_value") else d.dim_param
                                for d in info.type.tensor_type.shape.dim])
        recorded = shapes.get(info.name)
        if recorded is None or inferred.count(None) < recorded.count(None):
            shapes[info.name] = inferred
    return shapes


def _known_dims(shape) -> list:
    return [d if isinstance(d, int) or (isinstance(d, str) and d and not d.startswith("unk__")) else None
            for d in shape]


def same_shape(a: list | None, b: list | None) -> bool:
    """Whether two shapes are provably equal: same rank, each dim the same int or the same symbolic dim."""
    return a is not None and b is not None and len(a) == len(b) and all(
        x is not None and x == y for x, y in zip(a, b))
