"""The rewrite pass: load, check the opset, infer shapes, run the family rewrites, clean up, sort, and
declare our op domain. Verification and saving are separate steps (``verification.py``, ``io.py``).
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from trt_fusedattn import io
from trt_fusedattn.calibration import (DEFAULT_SOURCE, FLOAT8_IR_VERSION, Method, calibrate, calibrated_amax,
                                      parse_method)
from trt_fusedattn.contract import DOMAIN
from trt_fusedattn.errors import InputError
from trt_fusedattn.plugins import CONTRACTS
from trt_fusedattn.plugins.tensorrt_choice import table_arch
from trt_fusedattn.qdq import declare_opset, unabsorbed_quantizers
from trt_fusedattn.report import Report
from trt_fusedattn.rewrites import FAMILIES, run_all
from trt_fusedattn.rewrites._folding import constants_to_initializers
from trt_fusedattn.rewrites.attention.rotation_fold import fold_rotations
from trt_fusedattn.rewrites.conv import fp8_chain, qdq

# Default-domain opsets the rewrites read: from 13 (Softmax over one axis, Split/Squeeze/Unsqueeze axes as
# inputs) to the newest this onnx package knows.
MIN_OPSET = 13


def default_opset(model: onnx.ModelProto) -> int | None:
    """The model's ``ai.onnx`` opset version, or None when it imports none."""
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return opset.version
    return None


def check_opset(model: onnx.ModelProto, where: str) -> None:
    version, newest = default_opset(model), onnx.defs.onnx_opset_version()
    if version is None or not MIN_OPSET <= version <= newest:
        raise InputError(f"{where}: opset {version} is not supported (supported: {MIN_OPSET} to {newest}); "
                         f"export the model again with an opset in that range")


def infer_shapes(model: onnx.ModelProto) -> None:
    """Add ONNX shape inference's value_info to ``model`` (inferred on its skeleton; best effort)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(io.skeleton(model)[0], strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError):
        return  # the rewrites then see fewer static shapes
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)


def check_families(only) -> None:
    unknown = set(only or ()) - set(FAMILIES)
    if unknown:
        raise InputError(f"unknown rewrite family {', '.join(sorted(unknown))}; choose from {', '.join(FAMILIES)}")


def check_target(target: str | None) -> None:
    """A target arch the conv choice table reads (None: no target), else the one-line InputError."""
    if target is not None:
        try:
            table_arch(target)
        except ValueError as err:
            raise InputError(str(err)) from None


def fuse(model_or_path, only=None, *, consume: bool = False, precision: str | None = None,
         calibration: str | int = DEFAULT_SOURCE, calib_method: Method | str = "max", dims=None,
         quiet: bool = True, target: str | None = None, fp8_chains: bool = True,
         fp8_rotate_qk: bool = False) -> tuple[onnx.ModelProto, Report]:
    """Rewrite every attention and convolution site of a model (ModelProto or path) into our custom ops.

    ``only``: family names to run (default all of ``FAMILIES``). ``consume=True`` lets the pass change the
    given ModelProto instead of copying it (saves the memory of a large model). ``precision="fp8"``: every
    FusedConv that has an FP8 kernel is made FP8 with scales calibrated on the original model (``calibration``:
    an .npz path or ``random:N``; ``calib_method``: see ``calibration.parse_method``; ``dims`` sizes random
    inputs; progress on stderr unless ``quiet``). Convs of a Q/DQ-quantized model are FP8 whatever the
    precision. ``target`` (a GPU arch, e.g. "sm_90a"): convs that TensorRT's own fused conv runs faster on that
    arch are left unfused (plugins/conv/tensorrt_choice); None fuses every conv the op can express.
    ``fp8_chains``: a FusedConv whose output only FP8 FusedConvs read writes it in e4m3 for them
    (``rewrites.conv.fp8_chain``); False keeps every FusedConv output in the original's tensors and dtypes (each
    node then checkable against the original alone). ``fp8_rotate_qk``: calibrated FP8 attention quantizes Q and K
    after a Hadamard rotation (lower error on outlier channels; folded into the Q/K projections where it can be,
    else two extra MatMuls a site). Returns the fused model
    and the report of every site found;
    a model with nothing to fuse comes back unchanged but for shape info."""
    check_families(only)
    if isinstance(model_or_path, onnx.ModelProto):
        where = "<in memory>"
        model = model_or_path if consume else onnx.ModelProto()
        if not consume:
            model.CopyFrom(model_or_path)
    else:
        where = str(model_or_path)
        model = io.load_model(model_or_path)[0]
    check_opset(model, where)
    original = None
    if precision == "fp8":  # calibration runs the original; the pass turns ``model`` into the fused model
        method = parse_method(calib_method) if isinstance(calib_method, str) else calib_method
        original = onnx.ModelProto()
        original.CopyFrom(model)
    check_target(target)
    attention_options = {"arch": target}
    if original is not None and (only is None or "attention" in only):  # the rewrite asks for its sites' Q, K, V
        attention_options["amax"] = functools.partial(calibrated_amax, original, calibration, method, dims, quiet)
        attention_options["rotate"] = fp8_rotate_qk
    fused, sites = rewrite(model, only, conv_options=dict(target=target, precision=precision),
                           attention_options=attention_options)
    report = Report(model=where, sites=sites)
    left = unabsorbed_quantizers(fused)
    if left:
        report.notes.append("FP8 Q/DQ left as it is (TensorRT runs it): " + ", ".join(
            f"{count} read by {op}" for op, count in sorted(left.items())) + "; Q/DQ around Conv and around "
            "attention's MatMuls and Softmax is absorbed where the site fuses (the others say why not)")
    if original is not None:
        report.notes.extend(calibrate(original, fused, sites, calibration, method, dims, quiet))
    if fp8_chains and (only is None or "conv" in only):  # FP8 convs from calibration or Q/DQ
        report.notes.extend(fp8_chain.chain_fp8(fused, sites))
    return fused, report


def rewrite(model: onnx.ModelProto, only=None, conv_options: dict | None = None,
            attention_options: dict | None = None) -> tuple[onnx.ModelProto, list]:
    """The pass itself on a loaded model, which becomes the fused model: shapes, family rewrites (``conv_options``,
    ``attention_options``: see ``rewrites.run_all``), cleanup, FP8 Q/K rotations folded into their projections,
    export (opset 19 where FP8 attention quantizes)."""
    constants_to_initializers(model, io.EXTERNAL_THRESHOLD)  # onnxscript's weights are Constant nodes
    infer_shapes(model)
    graph = gs.import_onnx(model)
    for tensor in graph.tensors().values():  # external weights are read only if a rewrite asks for them
        values = getattr(tensor, "_values", None)
        if isinstance(values, LazyValues) and values.tensor.data_location == onnx.TensorProto.EXTERNAL:
            tensor._values = _ExternalValues(values.tensor)
    quantized = qdq.dequantize_weights(graph) if only is None or "conv" in only else {}
    sites = run_all(graph, only, conv_options, attention_options)
    qdq.absorb(graph, sites, quantized)
    graph.cleanup()
    fold_rotations(graph)  # (after the cleanup: the replaced attention nodes no longer read the projections)
    graph.toposort()
    used = {(n.domain, n.op) for n in graph.nodes}
    opsets = list(model.opset_import)
    for contract in CONTRACTS:  # one declaration per domain, however many of its ops the graph uses
        if (contract.domain, contract.name) in used and all(o.domain != contract.domain for o in opsets):
            opsets.append(contract.opset())
    fused = _export(graph, model, opsets)
    if any(n.op_type == "FusedAttention" and n.domain == DOMAIN and any(a.name == "q_scale" for a in n.attribute)
           for n in fused.graph.node):  # FP8 attention's QuantizeLinear to e4m3: opset 19, float8 tensors (IR 9)
        try:
            declare_opset(fused)
        except ValueError as err:
            raise InputError(f"FP8 attention: {err}") from None
        fused.ir_version = max(fused.ir_version, FLOAT8_IR_VERSION)
    return fused, sites


class _ExternalValues(LazyValues):
    """A constant whose data lies in an external file (see ``io``), read when a rewrite asks for its values."""

    def load(self):
        dtype = onnx.helper.tensor_dtype_to_np_dtype(self.tensor.data_type)
        return np.frombuffer(io.read_external(self.tensor), dtype=dtype).reshape(tuple(self.tensor.dims)).copy()


def _export(graph: gs.Graph, model: onnx.ModelProto, opsets) -> onnx.ModelProto:
    """Write the rewritten graph into ``model`` itself. Its large initializers the rewrites left alone stay
    in place: ``gs.export_onnx`` copies every initializer, and copying gigabytes of weights costs seconds
    (a single tensor over 2 GB cannot be copied at all)."""
    kept = set()
    for tensor in graph.tensors().values():
        values = getattr(tensor, "_values", None)
        if (isinstance(tensor, gs.Constant) and isinstance(values, LazyValues) and values.tensor.name == tensor.name
                and io.nbytes(values.tensor) >= io.EXTERNAL_THRESHOLD):
            stub = onnx.TensorProto(name=tensor.name, data_type=values.tensor.data_type, dims=values.tensor.dims)
            tensor._values = LazyValues(stub)  # exported as this stub; the original stays in ``model``
            kept.add(tensor.name)
    exported = gs.export_onnx(graph, opset_imports=opsets)
    weights = model.graph.initializer
    for i in reversed(range(len(weights))):
        if weights[i].name not in kept:
            del weights[i]
    weights.extend(t for t in exported.graph.initializer if t.name not in kept)
    for name in ("node", "input", "output", "value_info", "sparse_initializer"):
        model.graph.ClearField(name)
        getattr(model.graph, name).extend(getattr(exported.graph, name))
    for name in ("functions", "opset_import"):
        model.ClearField(name)
        getattr(model, name).extend(getattr(exported, name))
    return model


def default_output(path) -> Path:
    """``model.onnx`` -> ``model.fused.onnx``, beside the input."""
    path = Path(path)
    return path.with_name((path.stem if path.suffix == ".onnx" else path.name) + ".fused.onnx")
