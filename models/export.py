"""Export a `Sample` with either torch ONNX exporter, and check the export against torch under onnxruntime."""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import torch

from models.architectures import Sample

EXPORTERS = {"torchscript": 17, "dynamo": 23}
EXAMPLE_BATCH, EXAMPLE_SEQ = 2, 8
TWO_GB = 2**31


def export(sample: Sample, path: str | os.PathLike, exporter: str, opset: int | None = None,
           fold_constants: bool = True) -> Path:
    """Write `sample` to `path` with the TorchScript (dynamo=False) or dynamo exporter; weights go to external
    data (`<file>.data`) only when the model is over 2 GB. `fold_constants=False` (TorchScript only) keeps
    BatchNormalization nodes that constant folding would merge into the Conv weights."""
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}: use one of {sorted(EXPORTERS)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    opset = opset or EXPORTERS[exporter]
    args = sample.make_inputs(EXAMPLE_BATCH, EXAMPLE_SEQ, torch.Generator().manual_seed(1234))
    big = sum(p.numel() * p.element_size() for p in sample.model.parameters()) >= TWO_GB
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript" and big:
            # Over 2 GB the TorchScript exporter writes one external file per tensor; gather them into one.
            with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
                _export_torchscript(sample, args, Path(scratch) / path.name, opset, fold_constants)
                onnx.save_model(onnx.load(str(Path(scratch) / path.name)), str(path), save_as_external_data=True,
                                all_tensors_to_one_file=True, location=path.name + ".data")
        elif exporter == "torchscript":
            _export_torchscript(sample, args, path, opset, fold_constants)
        else:
            program = torch.onnx.export(
                sample.model, args, dynamo=True, opset_version=opset, input_names=list(sample.input_names),
                output_names=list(sample.output_names), dynamic_shapes=_dynamic_shapes(sample), optimize=True)
            program.save(str(path), external_data=big)
    return path


def _export_torchscript(sample: Sample, args, path: Path, opset: int, fold_constants: bool) -> None:
    torch.onnx.export(
        sample.model, args, str(path), dynamo=False, opset_version=opset,
        input_names=list(sample.input_names), output_names=list(sample.output_names),
        dynamic_axes=sample.dynamic_axes, do_constant_folding=fold_constants)


def _dynamic_shapes(sample: Sample) -> tuple[tuple[dict[int, torch.export.Dim], ...]]:
    """The dynamo exporter's form of `sample.dynamic_axes` for the wrapper's `*inputs`: one named Dim per axis
    name, shared by all inputs."""
    dims = {}
    shapes = []
    for name in sample.input_names:
        axes = sample.dynamic_axes.get(name, {})
        shapes.append({axis: dims.setdefault(dim, torch.export.Dim(dim, min=1, max=4096)) for axis, dim in axes.items()})
    return (tuple(shapes),)


def run_torch(sample: Sample, inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    with torch.no_grad():
        return [out.float().numpy() for out in sample.model(*inputs)]


def run_onnxruntime(path: str | os.PathLike, input_names, inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = {name: tensor.numpy() for name, tensor in zip(input_names, inputs)}
    return [np.asarray(out, dtype=np.float32) for out in session.run(None, feeds)]


def relative_error(sample: Sample, path: str | os.PathLike, batch: int = 3, seq: int = 5, seed: int = 7) -> float:
    """max |onnxruntime - torch| / max |torch| over all outputs, on fresh random inputs of a shape other than
    the export example's (so dynamic axes are exercised)."""
    inputs = sample.make_inputs(batch, seq, torch.Generator().manual_seed(seed))
    expected = run_torch(sample, inputs)
    actual = run_onnxruntime(path, sample.input_names, inputs)
    return max(float(np.abs(a - e).max() / max(np.abs(e).max(), 1e-30)) for a, e in zip(actual, expected))


def op_counts(path: str | os.PathLike) -> dict[str, int]:
    """How many nodes of each op type the model's main graph holds (functions inlined by name only)."""
    model = onnx.load(str(path), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
