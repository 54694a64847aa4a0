"""Tensor shapes a rewrite can rely on, in one object each family pass makes and passes to its checks: static
dims (recorded, else onnxruntime's symbolic inference, else Reshape targets), and shapes derived symbolically
through convolutions, pools and elementwise ops so that two dynamic shapes can be proved equal (a residual Add
of a model exported with dynamic height and width)."""
from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_graphsurgeon as gs

from trt_fusedattn.rewrites._graph import (attribute_text, constant_value, is_op, is_standard, producer, static_value,
                                           symbolic_dims, weightless_copy)

# Ops whose first output has the shape of their first input.
_SHAPE_PRESERVING = {
    "Abs", "BatchNormalization", "Cast", "Clip", "Dropout", "Elu", "Erf", "Exp", "Gelu", "GroupNormalization",
    "HardSigmoid", "HardSwish", "Identity", "InstanceNormalization", "LayerNormalization", "LeakyRelu", "Log", "Mish",
    "Neg", "RMSNormalization", "Relu", "Selu", "Sigmoid", "Softmax", "Softplus", "Sqrt", "Swish", "Tanh",
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
    opaque: bool = False  # the symbol names one unknown dim of one tensor (equal only to itself), not a model dim

    def window(self, add: int, stride: int) -> FloorDim:
        """``floor((self + add) / stride)``."""
        return FloorDim(self.symbol, self.offset + add * self.divisor, self.divisor * stride, self.opaque)

    def __str__(self) -> str:
        inner = f"{self.symbol}{self.offset:+d}" if self.offset else self.symbol
        return inner if self.divisor == 1 else f"({inner})//{self.divisor}"


def describe(dims: list | None) -> list | None:
    """Dims as reports show them: ints, symbolic dims as text, None where unknown."""
    return None if dims is None else [None if isinstance(d, FloorDim) and d.opaque else str(d)
                                      if isinstance(d, FloorDim) else d for d in dims]


def _window(dim, add: int, stride: int):
    if isinstance(dim, int):
        return (dim + add) // stride
    return dim.window(add, stride) if isinstance(dim, FloorDim) else None


class TensorShapes:
    """Shapes of one graph's tensors, made at the start of a family's pass.

    Proofs: ``of`` (dims int or FloorDim, an unknown dim an opaque FloorDim of its own; onnx inference completes
    the shapes of ``wanted`` tensors), ``same``, ``report``. Static dims: ``dim``, ``rank``, ``report_recorded`` read the shapes as the graph records
    them now, completed (``symbolic=True``) by onnxruntime's symbolic inference of the graph as it was when this
    object was made (inferred on first use) and by Reshape targets."""

    def __init__(self, graph: gs.Graph, wanted: list[gs.Tensor] = (), symbolic: bool = False):
        self.recorded = tensor_shapes(graph, list(wanted))
        self._graph, self._derived = graph, None
        self._symbolic_model = weightless_copy(graph) if symbolic else None
        self._symbolic: dict | None = None

    def of(self, tensor: gs.Tensor) -> list | None:
        """The tensor's dims: derived where derivable in full (exporters' own annotations can be wrong), else as
        recorded or inferred, with symbolic names as FloorDims."""
        if self._derived is None:
            self._derived = {}
            for node in self._graph.nodes:  # topological order: inputs are derived before the nodes reading them
                dims = self._derive(node)
                if dims is not None and node.outputs:
                    self._derived[node.outputs[0].name] = dims
        derived = self._derived.get(tensor.name)
        if derived is not None and None not in derived:
            return derived
        recorded = self.recorded.get(tensor.name)
        dims = derived if recorded is None else [FloorDim(d) if isinstance(d, str) else d for d in recorded]
        # an unknown dim stands for itself: two tensors computed from one through shape-keeping ops share it
        return None if dims is None else [FloorDim(f"{tensor.name}[{axis}]", opaque=True) if d is None else d
                                          for axis, d in enumerate(dims)]

    def report(self, tensor: gs.Tensor) -> list | None:
        """The dims as a Site shows them (``describe``)."""
        return describe(self.of(tensor))

    def same(self, a: gs.Tensor, b: gs.Tensor) -> bool:
        """Whether the two tensors provably have one shape."""
        return same_shape(self.of(a), self.of(b))

    def symbolic(self, tensor: gs.Tensor) -> list | None:
        """The tensor's dims by onnxruntime's symbolic inference (run on first use), None without it."""
        if self._symbolic_model is None:
            return None
        if self._symbolic is None:
            self._symbolic = symbolic_dims(self._symbolic_model)
        return self._symbolic.get(tensor.name)

    def dim(self, tensor: gs.Tensor, axis: int, infer: bool = True) -> int | None:
        """A static dim of a tensor (int): recorded or (``infer``) found by symbolic inference or a Reshape
        target; None when unknown or symbolic."""
        for shape in (_recorded(tensor), self.symbolic(tensor) if infer else None):
            if shape is not None and -len(shape) <= axis < len(shape):
                value = shape[axis]
                if isinstance(value, int) and value >= 0:
                    return value
            if not infer:
                return None
        return self._reshape_target_dim(tensor, axis)

    def rank(self, tensor: gs.Tensor) -> int | None:
        """The tensor's rank, recorded or by symbolic inference."""
        if tensor.shape is not None:
            return len(tensor.shape)
        inferred = self.symbolic(tensor)
        return None if inferred is None else len(inferred)

    def report_recorded(self, tensor: gs.Tensor) -> list | None:
        """The dims a Site shows: recorded, with unknown ones named by symbolic inference when it has run already."""
        recorded, inferred = _recorded(tensor), (self._symbolic or {}).get(tensor.name)
        if recorded is None or inferred is None or len(inferred) != len(recorded):
            return _listed(recorded if recorded is not None else inferred)
        return _listed([r if isinstance(r, int) or i is None else i for r, i in zip(recorded, inferred)])

    def _reshape_target_dim(self, tensor: gs.Tensor, axis: int) -> int | None:
        """The dim a Reshape sets from a static element of its target, e.g. embed_dim // heads that torch's
        MultiheadAttention export computes from a static input dim (where shape inference gives up)."""
        node = producer(tensor)
        while node is not None and node.op in ("Mul", "Div", "Add", "Sub", "Cast") and is_standard(node):
            # elementwise with one-element operands keeps the shape of the other operand
            larger = [t for t in node.inputs if _recorded(t) is None or any(d != 1 for d in _recorded(t))]
            if len(larger) != 1:
                return None
            node = producer(larger[0])
        if not is_op(node, "Reshape"):
            return None
        concat = producer(node.inputs[1])
        parts = concat.inputs if is_op(concat, "Concat") else [node.inputs[1]]
        lengths = [self.dim(part, 0, infer=False) for part in parts]
        if None in lengths:
            return None
        position = axis % sum(lengths)
        for part, length in zip(parts, lengths):
            if position < length:
                value = static_value(part)
                dim = int(value.reshape(-1)[position]) if value is not None else None
                return dim if dim is not None and dim > 0 else None
            position -= length
        return None

    def _derive(self, node: gs.Node) -> list | None:
        if not is_standard(node) or not node.inputs:
            return None
        if node.op in _SHAPE_PRESERVING:
            return self.of(node.inputs[0])
        if node.op in _WINDOWED:
            return self._windowed(node)
        if node.op in _BROADCASTING and len(node.inputs) == 2:
            return self._broadcast(*node.inputs)
        shape_of = producer(node.inputs[1]) if node.op == "Reshape" else None
        if is_op(shape_of, "Shape") and "start" not in shape_of.attrs and "end" not in shape_of.attrs:
            return self.of(shape_of.inputs[0])  # Reshape(y, Shape(x)): back to x's shape (GroupNorm's export)
        if node.op == "Concat":
            return self._concatenated(node)
        return None

    def _concatenated(self, node: gs.Node) -> list | None:
        """A Concat's shape where its inputs provably agree off the axis and their sizes on it are ints."""
        parts = [self.of(t) for t in node.inputs]
        if any(p is None or len(p) != len(parts[0]) for p in parts):
            return None
        axis = node.attrs.get("axis", 0) % len(parts[0])
        others = [[d for i, d in enumerate(p) if i != axis] for p in parts]
        if not all(same_shape(others[0], o) for o in others) or not all(isinstance(p[axis], int) for p in parts):
            return None
        return [sum(p[axis] for p in parts) if i == axis else d for i, d in enumerate(parts[0])]

    def _windowed(self, node: gs.Node) -> list | None:
        x = self.of(node.inputs[0])
        if is_op(node, "Conv"):
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
        auto_pad = attribute_text(node, "auto_pad", "NOTSET")
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


def _recorded(tensor: gs.Tensor) -> list | None:
    """The shape the graph records for ``tensor`` now."""
    return None if tensor.shape is None else list(tensor.shape)


def _listed(shape) -> list | None:
    return None if shape is None else [d if isinstance(d, int) else str(d) for d in shape]
