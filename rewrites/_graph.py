"""Generic onnx-graphsurgeon helpers the pattern rewrites share: op and attribute checks, constant values,
consumers, names (shapes: ``_shapes.py``).

Nothing here knows a pattern; each function answers one question about the graph as exported."""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx.reference import ReferenceEvaluator

_CONSTANT_ATTRS = ("value", "value_float", "value_floats", "value_int", "value_ints")
STANDARD_DOMAINS = (None, "", "ai.onnx")  # the default ONNX domain, by each name a model may write it


def is_standard(node: gs.Node | None) -> bool:
    """Whether ``node`` is an op of the default ONNX domain (written as "" or "ai.onnx")."""
    return node is not None and node.domain in STANDARD_DOMAINS


def is_op(node: gs.Node | None, op: str) -> bool:
    """Whether ``node`` is the default-domain ONNX op ``op``."""
    return is_standard(node) and node.op == op


def attribute_text(node: gs.Node, name: str, default: str) -> str:
    """A string attribute of ``node`` as str (onnx-graphsurgeon gives bytes for some models), or ``default``."""
    value = node.attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


def permutation(node: gs.Node | None) -> tuple | None:
    """The permutation of a Transpose node, else None."""
    return tuple(node.attrs.get("perm", ())) if is_op(node, "Transpose") else None


def numpy_dtype(tensor: gs.Tensor) -> np.dtype | None:
    """A tensor's element type as a numpy dtype (ml_dtypes' for bfloat16), None when unknown."""
    if tensor.dtype is None:
        return None
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.dtype)) if isinstance(tensor.dtype, int) \
        else np.dtype(tensor.dtype)


def constant_value(tensor: gs.Tensor | None) -> np.ndarray | None:
    """The value of a tensor that is constant in the graph (initializer, Constant node, Identity of either)."""
    while isinstance(tensor, gs.Variable):
        if len(tensor.inputs) != 1:
            return None
        node = tensor.inputs[0]
        if is_op(node, "Identity"):
            tensor = node.inputs[0]
        elif is_op(node, "Constant"):
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


NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
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
        if not is_standard(node) or node.op in NONDETERMINISTIC or len(nodes) == max_nodes:
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
    return number(constant_value(tensor))


def number(value: np.ndarray | None) -> float | None:
    """The number a one-element numeric array holds (numpy or ml_dtypes types such as bfloat16), else None."""
    if value is None or value.size != 1 or value.dtype == bool or value.dtype.kind in "OSUM":
        return None
    try:
        return float(np.asarray(value, np.float64).reshape(()))
    except (TypeError, ValueError):
        return None


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


def other_operand(node: gs.Node, tensor: gs.Tensor) -> gs.Tensor | None:
    """The input of a two-input node that is not ``tensor`` (None when both are)."""
    if len(node.inputs) != 2:
        return None
    a, b = node.inputs
    return b if a is tensor and b is not tensor else a if b is tensor and a is not tensor else None


def replace_tensor(old: gs.Tensor, new: gs.Tensor, graph: gs.Graph) -> None:
    """Make every reader of ``old`` (nodes, graph outputs) read ``new`` instead."""
    for reader in list(old.outputs):
        for i, tensor in enumerate(reader.inputs):
            if tensor is old:
                reader.inputs[i] = new
    graph.outputs = [new if t is old else t for t in graph.outputs]


def is_graph_output(tensor: gs.Tensor, graph: gs.Graph) -> bool:
    return any(out is tensor for out in graph.outputs)


def is_present(tensor: gs.Tensor | None) -> bool:
    """Whether an optional input slot is given (not missing, not the empty name)."""
    return tensor is not None and not (isinstance(tensor, gs.Variable) and tensor.is_empty())


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


_STATIC_OPS = {"Cast", "Sqrt", "Reciprocal", "Squeeze", "Unsqueeze", "Identity", "Div", "Mul", "Add", "Sub", "Gather",
               "Slice"}


def static_value(tensor: gs.Tensor, dim_of=None) -> np.ndarray | None:
    """The value of a small tensor computed from constants and the static dims of shapes only, e.g. the
    1/sqrt(head_dim) the sdpa export builds as Sqrt(1 / Cast(Slice(Shape(Q), -1))); None when it depends on
    run-time values. Scalar arithmetic only (Shape, Gather/Slice of a shape, Cast, Sqrt, +-*/). ``dim_of(tensor,
    axis)``: a caller's better knowledge of dims the recorded shapes leave unknown (int or None)."""
    value = _static(tensor, 12, dim_of)
    if value is not None and value.dtype == object:
        return None if any(d is None for d in value.reshape(-1)) else value.astype(np.int64)
    return value


def _static(tensor: gs.Tensor, depth: int, dim_of=None) -> np.ndarray | None:
    """The recursion of ``static_value``; a Shape gives an object array with None for dims that are not static."""
    value = constant_value(tensor)
    node = producer(tensor)
    if value is not None or node is None or depth == 0 or not is_standard(node):
        return value
    if node.op == "Shape":
        shape = node.inputs[0].shape
        if shape is None:
            return None
        axes = range(len(shape))[node.attrs.get("start", 0):node.attrs.get("end", len(shape))]
        dims = [shape[a] if isinstance(shape[a], int) and shape[a] >= 0 else dim_of(node.inputs[0], a) if dim_of
                else None for a in axes]
        return np.array(dims, dtype=object)
    if node.op not in _STATIC_OPS:
        return None
    args = [_static(t, depth - 1, dim_of) if is_present(t) else None for t in node.inputs]
    x = args[0] if args else None
    if x is None or node.op not in ("Gather", "Slice") and x.dtype == object:  # dims only Gather/Slice may pick
        x = None if x is None or any(d is None for d in x.reshape(-1)) else x.astype(np.int64)
    if x is None:
        return None
    if node.op == "Cast":
        return x.astype(onnx.helper.tensor_dtype_to_np_dtype(node.attrs["to"]))
    if node.op in ("Sqrt", "Reciprocal"):
        return np.sqrt(x) if node.op == "Sqrt" else np.reciprocal(x)
    if node.op in ("Squeeze", "Unsqueeze", "Identity"):
        return x.reshape(-1)[:1] if x.size == 1 else None  # the one-element values scales are made of
    if len(args) < 2 or args[1] is None:
        return None
    y = args[1]
    if y.dtype == object:
        y = None if any(d is None for d in y.reshape(-1)) else y.astype(np.int64)
        if y is None:
            return None
    if node.op == "Div":
        both_int = np.issubdtype(x.dtype, np.integer) and np.issubdtype(y.dtype, np.integer)
        return np.trunc(x / y).astype(x.dtype) if both_int else np.divide(x, y)
    if node.op in ("Mul", "Add", "Sub"):
        return {"Mul": np.multiply, "Add": np.add, "Sub": np.subtract}[node.op](x, y)
    if node.op == "Gather" and x.ndim == 1:
        return np.asarray(np.take(x, y), dtype=x.dtype)  # an array even for one element of an object array
    if node.op == "Slice" and x.ndim == 1 and len(args) >= 3 and args[2] is not None:
        axes, steps = (args + [None, None])[3:5]
        if (axes is None or axes.reshape(-1).tolist() in ([0], [-1])) and (steps is None or steps.reshape(-1).tolist() == [1]):
            return x[int(y.reshape(-1)[0]):int(min(args[2].reshape(-1)[0], len(x)))]
    return None


def weightless_copy(graph: gs.Graph, threshold: int = 1 << 16) -> onnx.ModelProto:
    """The graph as a model whose constants of ``threshold`` bytes or more are graph inputs of their type and
    shape (no data copied), and whose Constant nodes are initializers (onnxruntime's symbolic inference reads
    only their ``value`` form): enough for shape inference, cheap for models of any size."""
    copy = graph.copy()
    stubs = {}
    for node in [n for n in copy.nodes if is_op(n, "Constant") and len(n.outputs) == 1]:
        out, tensor = node.outputs[0], node.attrs.get("value")
        if isinstance(tensor, gs.Constant) and constant_nbytes(tensor) >= threshold:
            stubs[out.name] = replacement = gs.Variable(out.name, dtype=tensor.dtype, shape=list(tensor.shape))
        elif _constant_node_value(node) is not None:
            replacement = gs.Constant(out.name, _constant_node_value(node))
        else:
            continue
        replace_tensor(out, replacement, copy)
        node.outputs.clear()
        copy.nodes.remove(node)
    for node in copy.nodes:
        for i, tensor in enumerate(node.inputs):
            if isinstance(tensor, gs.Constant) and constant_nbytes(tensor) >= threshold:
                if tensor.name not in stubs:
                    stubs[tensor.name] = gs.Variable(tensor.name, dtype=tensor.dtype, shape=list(tensor.shape))
                node.inputs[i] = stubs[tensor.name]
    copy.inputs = list(copy.inputs) + list(stubs.values())
    copy.cleanup()  # dead nodes (e.g. an unused Expand of a computed shape) can only make inference fail
    return gs.export_onnx(copy, do_type_check=False)


def constant_nbytes(constant: gs.Constant) -> int:
    """A constant's size from its shape and type, without loading (or converting) its data."""
    dtype = constant.dtype
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(dtype).itemsize if isinstance(dtype, int) else np.dtype(dtype).itemsize
    return int(np.prod(constant.shape, dtype=np.int64)) * itemsize


def symbolic_dims(model: onnx.ModelProto) -> dict[str, list]:
    """Tensor dims by name from onnxruntime's symbolic shape inference, which follows shape arithmetic (Shape,
    Gather, Concat, Slice into Reshape) where onnx's inference gives up: ints, symbolic names (str) or None.
    An empty dict when it cannot handle the model."""
    inferred = _infer_symbolic_shapes(model)
    if inferred is None:
        return {}
    return {info.name: [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                        for d in info.type.tensor_type.shape.dim]
            for info in [*inferred.graph.value_info, *inferred.graph.output]
            if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape")}


def _infer_symbolic_shapes(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model with every shape inferred, or None. The steps of ``SymbolicShapeInference.infer_shapes``
    without its failure path, which saves the partial model as ``sym_shape_infer_temp.onnx`` (plus external
    data files) in the working directory: a tool run on untrusted models writes nothing it was not asked to."""
    inference = _symbolic_shape_inference()(2**31 - 1, True, False, 0)  # int_max, auto_merge, guess rank, verbose
    try:
        inference._preprocess(model)
        complete = False
        while inference.run_:
            complete = inference._infer_impl()
        inference._update_output_from_vi()
    except Exception:  # noqa: BLE001 - a best effort: ops it does not know, models it rejects
        return None
    return inference.out_mp_ if complete else None


@functools.cache
def _symbolic_shape_inference():
    """onnxruntime's SymbolicShapeInference, loaded from its file: importing it as a submodule runs
    ``onnxruntime/tools/__init__.py``, which imports torch where it is installed (seconds per process)."""
    path = Path(importlib.util.find_spec("onnxruntime").origin).parent / "tools" / "symbolic_shape_infer.py"
    spec = importlib.util.spec_from_file_location("_trt_fusedattn_symbolic_shape_infer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SymbolicShapeInference
