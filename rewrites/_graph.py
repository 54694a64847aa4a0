"""Generic onnx-graphsurgeon helpers the pattern rewrites share: constant values, consumers, shapes, names.

Nothing here knows a pattern; each function answers one question about the graph as exported."""
from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx.reference import ReferenceEvaluator

_CONSTANT_ATTRS = ("value", "value_float", "value_floats", "value_int", "value_ints")


def constant_value(tensor: gs.Tensor | None) -> np.ndarray | None:
    """The value of a tensor that is constant in the graph (initializer, Constant node, Identity of either)."""
    while isinstance(tensor, gs.Variable):
        if len(tensor.inputs) != 1:
            return None
        node = tensor.inputs[0]
        if node.op == "Identity" and not node.domain:
            tensor = node.inputs[0]
        elif node.op == "Constant" and not node.domain:
            return _constant_node_value(node)
        else:
            return None
    if isinstance(tensor, gs.Constant):
        return np.asarray(tensor.values)
    return None


def _constant_node_value(node: gs.Node) -> np.ndarray | None:
    for name in _CONSTANT_ATTRS:
        if name in node.attrs:
            value = node.attrs[name]
            return np.asarray(value.values if isinstance(value, gs.Constant) else value)
    return None  # sparse_value / string forms: not a number a rewrite can fold


_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                     "Bernoulli"}


def folded_value(tensor: gs.Tensor | None, graph: gs.Graph, max_nodes: int = 64) -> np.ndarray | None:
    """Like ``constant_value``, and also the value of a small subgraph computed from constants only (e.g. Pad
    amounts an exporter builds with ConstantOfShape/Concat/Slice), evaluated with onnx's reference runtime."""
    value = constant_value(tensor)
    if value is not None or not isinstance(tensor, gs.Variable) or producer(tensor) is None:
        return value
    nodes, stack, seen = [], [producer(tensor)], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.domain not in (None, "", "ai.onnx") or node.op in _NONDETERMINISTIC or len(nodes) == max_nodes:
            return None
        nodes.append(node)
        for source in node.inputs:
            if isinstance(source, gs.Variable) and not source.is_empty():
                if producer(source) is None:
                    return None  # reaches a graph input: not a constant
                stack.append(producer(source))
    sub = gs.Graph(nodes=nodes, outputs=[tensor], opset=graph.opset).toposort()
    try:
        model = gs.export_onnx(sub, do_type_check=False)
        return np.asarray(ReferenceEvaluator(model).run(None, {})[0])
    except Exception:  # noqa: BLE001 - an op the reference runtime lacks: treat the tensor as not constant
        return None


def scalar_value(tensor: gs.Tensor | None) -> float | None:
    """The number a one-element constant tensor holds (any rank), else None."""
    value = constant_value(tensor)
    if value is None or value.size != 1 or not np.issubdtype(value.dtype, np.number):
        return None
    return float(value.reshape(()))


def producer(tensor: gs.Tensor | None) -> gs.Node | None:
    """The node that writes ``tensor`` (None for graph inputs, initializers, empty optional inputs)."""
    if isinstance(tensor, gs.Variable) and len(tensor.inputs) == 1:
        return tensor.inputs[0]
    return None


def consumers(tensor: gs.Tensor) -> list[gs.Node]:
    """The distinct nodes reading ``tensor`` (a node reading it twice is listed once)."""
    seen: dict[int, gs.Node] = {}
    for node in tensor.outputs:
        seen.setdefault(id(node), node)
    return list(seen.values())


def sole_consumer(tensor: gs.Tensor, graph: gs.Graph) -> gs.Node | None:
    """The one node reading ``tensor`` when nothing else (no other node, no graph output) does, else None."""
    readers = consumers(tensor)
    if len(readers) != 1 or any(out is tensor for out in graph.outputs):
        return None
    return readers[0]


def is_graph_output(tensor: gs.Tensor, graph: gs.Graph) -> bool:
    return any(out is tensor for out in graph.outputs)


def is_present(tensor: gs.Tensor | None) -> bool:
    """Whether an optional input slot is given (not missing, not the empty name)."""
    return tensor is not None and not (isinstance(tensor, gs.Variable) and tensor.is_empty())


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
    """Whether two shapes are provably equal: same rank, each dim the same int or the same symbolic name."""
    return a is not None and b is not None and len(a) == len(b) and all(
        x is not None and x == y for x, y in zip(a, b))


def names_in_use(graph: gs.Graph) -> set[str]:
    """Every node and tensor name of the graph (to pass to ``unique_name``)."""
    return {node.name for node in graph.nodes} | set(graph.tensors())


def unique_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_<n>`` when ``taken`` holds it already; the name returned is added to ``taken``."""
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name
