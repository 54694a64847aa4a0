"""Random inputs of a model's shapes, valid for what the inputs mean, for verification.

Dynamic dimensions: batch 2, image height/width 32, sequences (and any other) 17, an odd size so kernels'
tails are exercised; a name shared by several inputs gets one size, and a name that is arithmetic of
other names (torch.export's ``s16 + s62``: a KV cache's past plus new length) gets their value. Floats
are standard normal; integer inputs read by a Gather (token ids) are valid row indices of its table, others
small values; inputs whose name says mask are padding masks: ones with trailing zeros on every row, never a row of
one value only. Static dimensions are kept as the model declares them, 0 included.

Sizes come from the model (static dims) and the user (``dims``), so they are checked before anything is
allocated: every name in ``dims`` must be a named dimension of an input, and the inputs together may take
at most ``MAX_INPUT_BYTES``.
"""
from __future__ import annotations

import ast
import math
import operator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trt_fusedattn.errors import InputError

BATCH, IMAGE_SIDE, SEQUENCE, SMALL_INT = 2, 32, 17, 4
MAX_INPUT_BYTES = 2**30  # verification inputs of a model together; more is refused before allocating


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller feeds (initializers listed as inputs, as old exporters do, left out)."""
    weights = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in weights]


_SEQUENCE_HINTS = ("seq", "len", "token", "kv", "past", "total")
_IMAGE_HINTS = ("height", "width")


DEFAULT_SIZES = {"batch": BATCH, "sequence": SEQUENCE, "image": IMAGE_SIDE}


def dim_role(value: onnx.ValueInfoProto, axis: int) -> str:
    """What a dynamic dimension of an input is: ``batch`` by its name or (unnamed otherwise) at axis 0,
    ``sequence`` or ``image`` by its name; unnamed ones are image sides in an image-like input (rank 4,
    float, 1, 3 or 4 channels), sequences elsewhere."""
    tensor = value.type.tensor_type
    name = tensor.shape.dim[axis].dim_param.lower()
    channels = tensor.shape.dim[1].dim_value if len(tensor.shape.dim) == 4 else 0
    if "batch" in name:
        return "batch"
    if any(h in name for h in _SEQUENCE_HINTS):
        return "sequence"
    if axis == 0:
        return "batch"
    if any(h in name for h in _IMAGE_HINTS) or (tensor.elem_type in _FLOATS and channels in (1, 3, 4) and axis >= 2):
        return "image"
    return "sequence"


def concrete_shape(value: onnx.ValueInfoProto, dims: dict, sizes: dict | None = None) -> list[int]:
    """Static shape for one input; fills ``dims`` with the sizes chosen for named dimensions. A dynamic
    dimension takes the size of its role (``dim_role``) from ``sizes`` (default ``DEFAULT_SIZES``)."""
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    shape = []
    for axis, dim in enumerate(value.type.tensor_type.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value >= 0:
            shape.append(dim.dim_value)
            continue
        size = sizes[dim_role(value, axis)]
        if dim.dim_param:
            size = dims.setdefault(dim.dim_param, size)
        shape.append(size)
    return shape


def _named_axes(model: onnx.ModelProto):
    """(input, axis, name) of every named dynamic dimension of the inputs."""
    for value in graph_inputs(model):
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param and not (dim.HasField("dim_value") and dim.dim_value >= 0):
                yield value, axis, dim.dim_param


_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def dim_expressions(model: onnx.ModelProto) -> dict[str, ast.expr]:
    """Named dims that are arithmetic (+ - * //, integers) of other named dims of the inputs, parsed:
    torch.export names a KV cache's total length ``s16 + s62``. A name with an operator whose parts are
    no dims elsewhere (``seq-len``) is a plain name."""
    names = {name for _, _, name in _named_axes(model)}
    expressions = {}
    for name in names - {n for n in names if n.isidentifier()}:
        try:
            tree = ast.parse(name, mode="eval").body
        except SyntaxError:
            continue
        parts = list(ast.walk(tree))
        arithmetic = all(isinstance(n, (ast.BinOp, ast.Name, ast.Load, *_ARITHMETIC)) or
                         (isinstance(n, ast.Constant) and type(n.value) is int) for n in parts)
        if arithmetic and isinstance(tree, ast.BinOp) and all(n.id in names for n in parts if isinstance(n, ast.Name)):
            expressions[name] = tree
    return expressions


def _evaluate(tree: ast.expr, sizes: dict) -> int:
    if isinstance(tree, ast.BinOp):
        return _ARITHMETIC[type(tree.op)](_evaluate(tree.left, sizes), _evaluate(tree.right, sizes))
    return sizes[tree.id] if isinstance(tree, ast.Name) else tree.value


def dim_roles(model: onnx.ModelProto) -> dict[str, str]:
    """Role of each named dynamic dimension of the inputs that is no expression of others (the first input
    that has it decides)."""
    roles, expressions = {}, dim_expressions(model)
    for value, axis, name in _named_axes(model):
        if name not in expressions:
            roles.setdefault(name, dim_role(value, axis))
    return roles


def sized_dims(model: onnx.ModelProto, dims: dict | None = None, sizes: dict | None = None) -> dict[str, int]:
    """Size of every named dynamic dimension: as given in ``dims``, else by its role (``sizes``, default
    ``DEFAULT_SIZES``); expressions of names (``dim_expressions``) evaluated from those."""
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    dims = {**{name: sizes[role] for name, role in dim_roles(model).items()}, **(dims or {})}
    for name, tree in dim_expressions(model).items():
        dims[name] = _evaluate(tree, dims)
        if dims[name] < 0:
            raise InputError(f"input dimension '{name[:80]}' would be {dims[name]} at "
                             f"{', '.join(f'{k}={v}' for k, v in dims.items() if k in dim_roles(model))}; "
                             f"give sizes that make it >= 0 with --dim NAME=SIZE")
    return dims


def baked_sizes(model: onnx.ModelProto, limit: int = 1 << 16) -> list[int]:
    """Sizes an export may have baked in for its example input, smallest first: the constants of Reshape
    targets (TorchScript writes the example's sequence length there) and the static dims of outputs."""
    constants = {t.name: t for t in model.graph.initializer}
    constants.update({n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant"
                      for a in n.attribute if a.name == "value" and a.HasField("t")})
    found = set()
    for node in model.graph.node:
        if node.op_type == "Reshape" and len(node.input) > 1 and node.input[1] in constants:
            target = constants[node.input[1]]
            if target.data_type == onnx.TensorProto.INT64 and len(target.dims) == 1 and target.dims[0] <= 8:
                found.update(int(v) for v in numpy_helper.to_array(target).tolist())
    for value in model.graph.output:
        found.update(d.dim_value for d in value.type.tensor_type.shape.dim if d.HasField("dim_value"))
    return sorted(v for v in found if 1 < v <= limit)


_SAME_VALUES = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast", "Transpose"}


def table_rows(model: onnx.ModelProto, name: str) -> int | None:
    """Rows of the smallest constant table a Gather reads with ``name`` as indices (a vocabulary size),
    following the ids through ops that only reshape or cast them."""
    tables = {t.name: t.dims for t in model.graph.initializer}
    ids, rows = {name}, []
    for node in model.graph.node:  # nodes are in topological order
        if node.op_type in _SAME_VALUES and node.input and node.input[0] in ids:
            ids.update(node.output)
        elif node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in ids and node.input[0] in tables:
            axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
            dims = tables[node.input[0]]
            rows.append(dims[axis % len(dims)])
    return min(rows) if rows else None


def padding_mask(shape: list[int]) -> np.ndarray:
    """Ones with ``1 + r * (L // 3) % (L - 1)`` trailing zeros on row r of the last axis: every row of two or more
    holds both values, so no row is fully masked whichever value a model reads as padding (Hugging Face: 0;
    torch's ``key_padding_mask``: True), where the original itself would produce NaN."""
    mask = np.ones(shape, dtype=np.int64)
    rows = mask.reshape(-1, shape[-1]) if shape and shape[-1] else mask.reshape(-1, 1)
    length = rows.shape[1]
    for r in range(rows.shape[0]):
        pad = 1 + (r * (length // 3)) % (length - 1) if length > 1 else 0
        rows[r, length - pad:] = 0
    return mask


_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def named_dims(model: onnx.ModelProto) -> set[str]:
    """The names of the inputs' dynamic dimensions that a user sizes (expressions of others are computed)."""
    return set(dim_roles(model))


def check_dim_names(model: onnx.ModelProto, dims: dict | None) -> None:
    """Refuse sizes given for names no input dimension has (a typo would otherwise be ignored silently)."""
    unknown = sorted(set(dims or ()) - named_dims(model))
    computed = [name for name in unknown if name in dim_expressions(model)]
    if computed:
        raise InputError(f"--dim {computed[0][:80]}: that dimension is computed from the others in its name; "
                         f"give those with --dim NAME=SIZE")
    if unknown:
        names = ", ".join(sorted(named_dims(model))) or "none: every input dimension is static"
        raise InputError(f"--dim {unknown[0][:80]}: the model's inputs have no dimension of that name "
                         f"(named dimensions: {names}); give one of those")


def _input_specs(model: onnx.ModelProto, dims: dict,
                 sizes: dict | None) -> list[tuple[onnx.ValueInfoProto, list[int], np.dtype]]:
    """(input, shape, numpy dtype) of every input, checked to fit ``MAX_INPUT_BYTES`` together."""
    specs = []
    dims.update(sized_dims(model, dims, sizes))
    for value in graph_inputs(model):
        if not value.type.HasField("tensor_type"):
            raise InputError(f"input '{value.name[:80]}' is not a tensor, which verification cannot make up; "
                             f"leave out --verify, or pass inputs= to verify() in Python")
        try:
            dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        except KeyError:
            raise InputError(f"input '{value.name[:80]}' has no known element type "
                             f"({value.type.tensor_type.elem_type}); export the model again") from None
        specs.append((value, concrete_shape(value, dims, sizes), dtype))
    sizes = [math.prod(shape) * max(dtype.itemsize, 8 if dtype == object else 1) for _, shape, dtype in specs]
    if sum(sizes) > MAX_INPUT_BYTES:
        (value, shape, _), _ = max(zip(specs, sizes), key=lambda item: item[1])
        dynamic = any(not d.HasField("dim_value") or d.dim_value < 0 for d in value.type.tensor_type.shape.dim)
        hint = ("give smaller sizes with --dim NAME=SIZE" if dynamic else
                "its dims are static in the model, so verify it with inputs= in Python on a larger machine")
        raise InputError(f"verification inputs would take {sum(sizes) / 2**30:.3g} GiB (input '{value.name[:80]}' "
                         f"{shape}), over the {MAX_INPUT_BYTES / 2**30:g} GiB limit; {hint}")
    return specs


def random_inputs(model: onnx.ModelProto, seed: int = 0, dims: dict | None = None,
                  sizes: dict | None = None) -> dict[str, np.ndarray]:
    """One array per graph input. ``dims`` (name -> size) overrides the size of named dynamic dimensions,
    ``sizes`` (role -> size, see ``dim_role``) the defaults of the others."""
    check_dim_names(model, dims)
    rng = np.random.default_rng(seed)
    dims = dict(dims or {})
    feeds = {}
    for value, shape, dtype in _input_specs(model, dims, sizes):
        elem = value.type.tensor_type.elem_type
        if "mask" in value.name.lower() and elem != onnx.TensorProto.STRING:
            array = padding_mask(shape)
        elif elem in _FLOATS:
            array = rng.standard_normal(shape)
        elif elem == onnx.TensorProto.BOOL:
            array = rng.integers(0, 2, shape)
        elif elem == onnx.TensorProto.STRING:
            array = np.array([chr(97 + i) for i in rng.integers(0, 26, math.prod(shape))], object).reshape(shape)
        else:
            rows = table_rows(model, value.name)
            array = rng.integers(0, rows if rows else SMALL_INT, shape)
        feeds[value.name] = array.astype(dtype)
    return feeds
