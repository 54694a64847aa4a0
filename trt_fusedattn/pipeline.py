"""The rewrite pass: load, check the opset, infer shapes, run the family rewrites, clean up, sort, and
declare our op domain. Verification and saving are separate steps (``verify.py``, ``io.py``).
"""
from __future__ import annotations

from pathlib import Path

import onnx
import onnx_graphsurgeon as gs

from trt_fusedattn import io
from trt_fusedattn.errors import InputError
from trt_fusedattn.plugins import CONTRACTS
from trt_fusedattn.report import Report
from trt_fusedattn.rewrites import FAMILIES, run_all

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
    """Add ONNX shape inference's value_info to ``model`` (large weights detached meanwhile; best effort)."""
    with io.large_tensors_detached(model):
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except (onnx.shape_inference.InferenceError, RuntimeError, ValueError):
            return  # the rewrites then see fewer static shapes
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)


def check_families(only) -> None:
    unknown = set(only or ()) - set(FAMILIES)
    if unknown:
        raise InputError(f"unknown rewrite family {', '.join(sorted(unknown))}; choose from {', '.join(FAMILIES)}")


def fuse(model_or_path, only=None, *, consume: bool = False) -> tuple[onnx.ModelProto, Report]:
    """Rewrite every attention and convolution site of a model (ModelProto or path) into our custom ops.

    ``only``: family names to run (default all of ``FAMILIES``). ``consume=True`` lets the pass change the
    given ModelProto instead of copying it (saves the memory of a large model). Returns the fused model and
    the report of every site found; a model with nothing to fuse comes back unchanged but for shape info."""
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
    fused, sites = rewrite(model, only)
    return fused, Report(model=where, sites=sites)


def rewrite(model: onnx.ModelProto, only=None) -> tuple[onnx.ModelProto, list]:
    """The pass itself on a loaded model (consumed): shapes, family rewrites, cleanup, export."""
    infer_shapes(model)
    graph = gs.import_onnx(model)
    sites = run_all(graph, only)
    graph.cleanup().toposort()
    used = {(n.domain, n.op) for n in graph.nodes}
    opsets = [o for o in model.opset_import]
    opsets += [c.opset() for c in CONTRACTS
               if (c.domain, c.name) in used and all(o.domain != c.domain for o in opsets)]
    fused = gs.export_onnx(graph, opset_imports=opsets)
    for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(fused, name, getattr(model, name))
    fused.metadata_props.extend(model.metadata_props)
    return fused, sites


def default_output(path) -> Path:
    """``model.onnx`` -> ``model.fused.onnx``, beside the input."""
    path = Path(path)
    return path.with_name((path.stem if path.suffix == ".onnx" else path.name) + ".fused.onnx")
