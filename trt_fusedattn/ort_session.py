"""Run a model under onnxruntime (CPU) with our custom nodes evaluated by Python callables.

Each ``trt_fusedattn`` node runs a callable taking numpy arrays (missing optional inputs as None) and the
node's resolved attributes as keywords, returning numpy arrays: the contract's numpy reference by default,
or any implementation the caller passes (e.g. our CUDA kernels, by the GPU tests). The bridge is
onnxruntime-extensions' Python custom ops, whose limits are worked around on a copy of the model:
- an op is registered with fixed input dtypes and count and string attributes only: each distinct
  (op, inputs present, dtypes) gets its own registered op type, and the node's attributes travel as one
  JSON string;
- it cannot pass float16 outputs nor bfloat16/float8 at all: such tensors are carried as float32 by Cast
  nodes around the custom node (exact both ways) and handed to the callable in their own dtype; one custom
  node's carried output reaches another custom node as it is (no Cast to float8 and back: invalid below opset 19);
- onnxruntime's Python API takes and gives no bfloat16/float8 arrays: such graph inputs and outputs are
  float32 at the copy's boundary (Cast inside), converted exactly on our side;
- onnxruntime reads models of IR version <= 13: the copy is labelled 13 when newer;
- standard ONNX ops whose onnxruntime CPU kernel refuses a valid node (``Attention`` with a [B, 1, 1, L]
  mask) can be evaluated the same way by onnx's reference implementation (``reference_ops``), so a
  model onnxruntime cannot run is still verified;
- an exception raised inside a Python custom op aborts the whole process (a C++ ``terminate``): nodes of
  our domain are checked against their contract before the run (opset version, inputs, outputs,
  attributes), and the callable's own exceptions are caught, kept, and raised after the run as a
  one-line ``FuseError``.
"""
from __future__ import annotations

import json
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from trt_fusedattn import io
from trt_fusedattn.contract import DOMAIN, OpContract
from trt_fusedattn.element_types import element_types
from trt_fusedattn.errors import FuseError, first_line
from trt_fusedattn.plugins import CONTRACTS

MAX_IR_VERSION = 13
_CARRIED_AS_FLOAT = {TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN,
                     TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ}
_NOT_IN_NUMPY_API = _CARRIED_AS_FLOAT - {TensorProto.FLOAT16}  # onnxruntime's Python API cannot pass these
_BY_OP = {(c.domain, c.name): c for c in CONTRACTS}
_BY_KEY = {c.qualified_name: c for c in CONTRACTS}


class RunFailed(FuseError):
    """onnxruntime loaded the model but failed running it on the inputs given (often: at those sizes)."""


@dataclass(frozen=True)
class _Signature:
    """What onnxruntime-extensions fixes per registered op type."""

    op: str                     # qualified name of the contract
    present: tuple              # per contract input: given or not
    input_types: tuple          # ONNX element types of the given inputs, as the node has them
    output_types: tuple


_REGISTERED: dict[_Signature, str] = {}   # signature -> op type registered (registration is process-wide)
_ACTIVE: dict[str, Callable] = {}         # qualified name -> implementation of the run in progress
_FAILURES: list[str] = []                 # what the custom nodes of the run in progress raised
_LOCK = threading.Lock()


def implementation_key(key) -> str:
    """``FUSED_ATTENTION``, ``"FusedAttention"`` or ``"trt_fusedattn::FusedAttention"`` -> the qualified name."""
    name = key.qualified_name if isinstance(key, OpContract) else str(key)
    name = name if "::" in name else f"{DOMAIN}::{name}"
    if name not in _BY_KEY:
        raise ValueError(f"no custom op {name}; known: {', '.join(_BY_KEY)}")
    return name


def _carrier(elem_type: int) -> int:
    return TensorProto.FLOAT if elem_type in _CARRIED_AS_FLOAT else elem_type


def _pyop_type(elem_type: int) -> int:
    from onnxruntime_extensions import PyCustomOpDef

    names = {TensorProto.FLOAT: "dt_float", TensorProto.DOUBLE: "dt_double", TensorProto.BOOL: "dt_bool",
             TensorProto.INT32: "dt_int32", TensorProto.INT64: "dt_int64", TensorProto.INT8: "dt_int8",
             TensorProto.UINT8: "dt_uint8"}
    if elem_type not in names:
        raise FuseError(f"custom node tensors of type {TensorProto.DataType.Name(elem_type)} cannot be evaluated "
                        f"on the CPU; verify this model on a GPU")
    return getattr(PyCustomOpDef, names[elem_type])


def _evaluator(contract: OpContract, sig: _Signature) -> Callable:
    in_np = [helper.tensor_dtype_to_np_dtype(t) for t in sig.input_types]
    out_np = [helper.tensor_dtype_to_np_dtype(t) for t in sig.output_types]

    def evaluate(*arrays, attributes):
        try:
            return run(*arrays, attributes=attributes)
        except BaseException as err:  # raised through onnxruntime it would abort the process: kept instead
            _FAILURES.append(f"{contract.qualified_name} ({type(err).__name__}: {first_line(err)})")
            empty = tuple(np.zeros(0, helper.tensor_dtype_to_np_dtype(_carrier(t))) for t in sig.output_types)
            return empty if len(empty) > 1 else empty[0]

    def run(*arrays, attributes):
        given = iter(a.astype(t, copy=False) for a, t in zip(arrays, in_np))
        args = [next(given) if present else None for present in sig.present]
        implementation = _ACTIVE.get(contract.qualified_name, contract.reference)
        results = implementation(*args, **contract.resolve(json.loads(attributes)))
        results = results if isinstance(results, tuple) else (results,)
        carried = []
        for result, dtype, elem in zip(results, out_np, sig.output_types):
            result = np.asarray(result)
            if result.dtype != dtype:
                raise TypeError(f"{contract.qualified_name} implementation returned {result.dtype}, "
                                f"the node's output is {dtype}")
            carried.append(np.ascontiguousarray(result.astype(helper.tensor_dtype_to_np_dtype(_carrier(elem)))))
        return tuple(carried) if len(carried) > 1 else carried[0]

    return evaluate


@dataclass(frozen=True)
class _OnnxReference:
    """A standard ONNX op evaluated by onnx's reference implementation, shaped as a contract for the bridge
    (``inputs``: one entry per input position of the node)."""

    op_type: str
    opset: int
    inputs: tuple
    domain: str = DOMAIN  # where the bridge registers it: custom ops cannot live in the default domain

    @property
    def name(self) -> str:
        return f"Onnx{self.op_type}"

    @property
    def qualified_name(self) -> str:
        return f"onnx::{self.op_type}-{self.opset}"

    def resolve(self, attrs: dict) -> dict:
        return attrs

    def reference(self, *arrays, _present_outputs, **attrs):
        from onnx.reference import ReferenceEvaluator

        inputs = [f"i{k}" if a is not None else "" for k, a in enumerate(arrays)]
        while inputs and not inputs[-1]:
            inputs.pop()
        outputs = [f"o{k}" if present else "" for k, present in enumerate(_present_outputs)]
        node = helper.make_node(self.op_type, inputs, outputs, **attrs)
        evaluator = ReferenceEvaluator(node, opsets={"": self.opset})
        results = evaluator.run([o for o in outputs if o], {n: a for n, a in zip(inputs, arrays) if n})
        return tuple(results) if len(results) > 1 else results[0]


def _registered_op_type(contract: OpContract, sig: _Signature) -> str:
    if sig not in _REGISTERED:
        from onnxruntime_extensions import PyCustomOpDef, onnx_op

        op_type = f"{contract.name}_{len(_REGISTERED)}"
        onnx_op(op_type=f"{contract.domain}::{op_type}",
                inputs=[_pyop_type(_carrier(t)) for t in sig.input_types],
                outputs=[_pyop_type(_carrier(t)) for t in sig.output_types],
                attrs={"attributes": PyCustomOpDef.dt_string})(_evaluator(contract, sig))
        _REGISTERED[sig] = op_type
    return _REGISTERED[sig]


def _attributes_json(node: onnx.NodeProto, **extra) -> str:
    def plain(value):
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value
    return json.dumps({**{a.name: plain(helper.get_attribute_value(a)) for a in node.attribute}, **extra})


def _copied(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def check_custom_node(node: onnx.NodeProto, contract: OpContract, version: int | None) -> None:
    """Refuse a node of our domain that its contract does not describe (it may come from the input model)."""
    where = f"node '{node.name[:80]}' ({contract.qualified_name})"
    if version != contract.version:
        raise FuseError(f"{where}: the model imports {contract.domain} opset {version}, this trt_fusedattn "
                        f"implements version {contract.version}; fuse the original model again with this version")
    required = sum(not spec.optional for spec in contract.inputs)
    inputs = list(node.input)
    if len(inputs) > len(contract.inputs) or len(inputs) < required or not all(inputs[:required]):
        raise FuseError(f"{where} has inputs {inputs}; it takes {required} to {len(contract.inputs)} "
                        f"({', '.join(spec.name for spec in contract.inputs)}); the model is corrupt, fuse the "
                        f"original again")
    if len(node.output) != len(contract.outputs) or not all(node.output):
        raise FuseError(f"{where} has {len(node.output)} outputs, the op has {len(contract.outputs)}; "
                        f"the model is corrupt, fuse the original again")
    try:
        contract.node_attributes(node)
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as err:
        raise FuseError(f"{where}: {first_line(err)}; the model is corrupt, fuse the original again") from None


def _reads(node: onnx.NodeProto) -> set[str]:
    """The tensor names a node reads, those its subgraphs (If, Loop, Scan) read included."""
    names = set(node.input)
    for attr in node.attribute:
        for graph in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            names |= {name for inner in graph.node for name in _reads(inner)} | {o.name for o in graph.output}
    return names


def bridged_model(model: onnx.ModelProto, reference_ops=()) -> onnx.ModelProto:
    """A copy of ``model`` onnxruntime can run with the custom nodes, and the standard ops named in
    ``reference_ops``, bridged to Python (see module doc)."""
    copy = io.load_weights(_copied(model))  # onnxruntime reads no external data by absolute path
    versions = {o.domain: o.version for o in copy.opset_import}
    for node in copy.graph.node:
        if (node.domain, node.op_type) in _BY_OP:
            check_custom_node(node, _BY_OP[node.domain, node.op_type], versions.get(node.domain))
    types = element_types(copy)
    weights = {t.name: t for t in copy.graph.initializer}
    bridged = [(n.domain, n.op_type) in _BY_OP or n.domain in ("", "ai.onnx") and n.op_type in reference_ops
               for n in copy.graph.node]
    read_unbridged = {o.name for o in copy.graph.output} | {
        name for node, b in zip(copy.graph.node, bridged) if not b for name in _reads(node)}
    passed = {}  # a float32-carried output of a bridged node -> its carrier, read as is by bridged readers
    nodes = []
    for node in copy.graph.node:
        contract = _BY_OP.get((node.domain, node.op_type))
        extra = {}
        if node.domain in ("", "ai.onnx") and node.op_type in reference_ops:
            contract = _OnnxReference(node.op_type, versions.get(node.domain, 1), tuple(node.input))
            extra = {"_present_outputs": [bool(o) for o in node.output]}
        if contract is None:
            if node.domain == DOMAIN:
                raise FuseError(f"node '{node.name}' is {DOMAIN}::{node.op_type}, an op this version does not know; "
                                f"upgrade trt_fusedattn")
            nodes.append(node)
            continue
        outputs = [o for o in node.output if o]
        missing = [t for t in [*node.input, *outputs] if t and t not in types]
        if missing:
            raise FuseError(f"cannot tell the dtype of {missing[0]} at node '{node.name}'; "
                            f"run shape inference on the model first")
        inputs = list(node.input) + [""] * (len(contract.inputs) - len(node.input))
        sig = _Signature(contract.qualified_name, tuple(bool(i) for i in inputs),
                         tuple(types[i] for i in inputs if i), tuple(types[o] for o in outputs))
        carried_in = []
        for name in filter(None, inputs):
            if name in weights and types[name] in _CARRIED_AS_FLOAT:  # converted here: below opset 19 a Cast
                if f"{name}__float" not in weights:                     # from float8 is not a valid node
                    weights[f"{name}__float"] = numpy_helper.from_array(
                        numpy_helper.to_array(weights[name]).astype(np.float32), f"{name}__float")
                    copy.graph.initializer.append(weights[f"{name}__float"])
                name = f"{name}__float"
            elif name in passed:
                name = passed[name]
            elif types[name] in _CARRIED_AS_FLOAT:
                nodes.append(helper.make_node("Cast", [name], [f"{name}__float_{node.name}"], to=TensorProto.FLOAT))
                name = f"{name}__float_{node.name}"
            carried_in.append(name)
        carried_out = [f"{o}__float" if types[o] in _CARRIED_AS_FLOAT else o for o in outputs]
        nodes.append(helper.make_node(_registered_op_type(contract, sig), carried_in, carried_out, name=node.name,
                                      domain=contract.domain, attributes=_attributes_json(node, **extra)))
        passed.update((o, c) for c, o in zip(carried_out, outputs) if c != o)
        nodes.extend(helper.make_node("Cast", [c], [o], to=types[o])  # only for readers outside the bridge: below
                     for c, o in zip(carried_out, outputs) if c != o and o in read_unbridged)  # opset 19 a Cast
    del copy.graph.node[:]                                                # to float8 is not a valid node
    copy.graph.node.extend(nodes)
    copy.ir_version = min(copy.ir_version, MAX_IR_VERSION)
    return copy


def runnable_model(model: onnx.ModelProto, reference_ops=()) -> tuple[onnx.ModelProto, dict[str, np.dtype]]:
    """The bridged copy with a numpy-friendly boundary, and the true dtypes of its float32-carried inputs/outputs."""
    copy = bridged_model(model, reference_ops)
    return copy, _float_boundary(copy.graph)


def _float_boundary(graph: onnx.GraphProto) -> dict[str, np.dtype]:
    """Make bfloat16/float8 graph inputs and outputs float32 (Cast inside, names kept); name -> true dtype."""
    weights = {t.name for t in graph.initializer}
    inputs = [v for v in graph.input if v.name not in weights and v.type.tensor_type.elem_type in _NOT_IN_NUMPY_API]
    outputs = [v for v in graph.output if v.type.tensor_type.elem_type in _NOT_IN_NUMPY_API]
    renamed = {v.name: f"{v.name}__{TensorProto.DataType.Name(v.type.tensor_type.elem_type).lower()}"
               for v in inputs + outputs}
    true_types = {v.name: v.type.tensor_type.elem_type for v in inputs + outputs}
    for node in graph.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
        node.output[:] = [renamed.get(o, o) for o in node.output]
    casts_in = [helper.make_node("Cast", [v.name], [renamed[v.name]], to=true_types[v.name]) for v in inputs]
    casts_out = [helper.make_node("Cast", [renamed[v.name]], [v.name], to=TensorProto.FLOAT) for v in outputs]
    nodes = casts_in + list(graph.node) + casts_out
    del graph.node[:]
    graph.node.extend(nodes)
    for v in inputs + outputs:
        v.type.tensor_type.elem_type = TensorProto.FLOAT
    return {name: helper.tensor_dtype_to_np_dtype(t) for name, t in true_types.items()}


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    """An onnxruntime CPU session of a model (as given: bridge it first if it has custom nodes)."""
    from onnxruntime_extensions import get_library_path

    options = ort.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    options.log_severity_level = 4  # fatal only: its errors reach the user as our one-line messages
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node):
        # onnxruntime's extended QDQ fusions are written for INT8: on FP8 Q/DQ they compute wrong results
        # (a Q/DQ ResNet: 100% error) or fail to load (Clip -> QuantizeLinear); the basic level is exact
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    try:
        if io.tensor_bytes(model) <= io.PROTOBUF_LIMIT // 2:
            return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        with tempfile.TemporaryDirectory() as folder:  # too large for one buffer: external data on disk
            path = Path(folder) / "model.onnx"
            io.save_model(model, path, external_data=True)
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except FuseError:
        raise
    except Exception as err:  # onnxruntime's own exception types
        raise FuseError(f"onnxruntime cannot load the model: {_ort_message(err)}") from err


_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
_ORT_NODE = re.compile(r"Non-zero status code returned while running (\S+) node\. Name:'([^']*)' Status Message: (.*)")


def _ort_message(err: BaseException) -> str:
    """onnxruntime's message, short: the node and the reason, without its source path and C++ signature."""
    text = _ORT_PREFIX.sub("", first_line(err))
    node = _ORT_NODE.match(text)
    if node:
        op, name, status = node.groups()
        reason = status.rsplit(" was false. ", 1)[-1] if " was false. " in status else re.sub(r"^\S+:\d+ ", "", status)
        text = f"while running {op} node '{name}': {reason}"
    return text if len(text) <= 400 else text[:400] + "..."


def run_model(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray],
              implementations: Mapping | None = None, reference_ops=()) -> dict[str, np.ndarray]:
    """Outputs of ``model`` (name -> array) on ``feeds``; custom nodes run ``implementations``
    (contract or op name -> callable), the numpy reference where none is given; standard ops named in
    ``reference_ops`` (e.g. ``("Attention",)``) run onnx's reference implementation."""
    active = {implementation_key(k): f for k, f in (implementations or {}).items()}
    runnable, carried = runnable_model(model, reference_ops)
    runner = session(runnable)
    names = [o.name for o in runner.get_outputs()]
    feeds = {k: np.asarray(v).astype(np.float32) if k in carried else v for k, v in feeds.items()}
    with _LOCK:
        _ACTIVE.clear()
        _ACTIVE.update(active)
        _FAILURES.clear()
        try:
            quiet = ort.RunOptions()
            quiet.log_severity_level = 4  # a failed run is reported once, by RunFailed, not logged on stderr
            outputs = runner.run(names, dict(feeds), quiet)
        except Exception as err:
            if not _FAILURES:
                raise RunFailed(f"onnxruntime failed to run the model: {_ort_message(err)}") from err
        finally:
            _ACTIVE.clear()
        if _FAILURES:
            raise FuseError(f"a custom node failed: {_FAILURES[0]}; check the node's inputs and attributes")
    return {n: out.astype(carried[n]) if n in carried else out for n, out in zip(names, outputs)}
