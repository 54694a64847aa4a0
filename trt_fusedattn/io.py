"""Reading and writing ONNX models: clear errors for bad files, external data, atomic writes.

A model is loaded whole (external data read into memory, as the rewrites read weights). It is saved to a
temporary file beside the target and renamed into place, so a failed or interrupted save never leaves a
partial output. Models whose tensors pass protobuf's 2 GB limit are saved with external data (one
``<name>.data`` file beside the model), as are models that had external data when loaded.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterator

import onnx
import numpy as np
from google.protobuf.message import DecodeError, EncodeError
from onnx import helper, numpy_helper

from trt_fusedattn.errors import InputError

PROTOBUF_LIMIT = 2**31 - 1          # bytes a serialized ModelProto may hold
EXTERNAL_THRESHOLD = 1024           # tensors of at least this many bytes go to the data file
_HEADROOM = 256 * 2**20             # room left for the graph itself when deciding on external data


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of the model: initializers and tensor attributes, subgraphs included."""
    def of_graph(graph: onnx.GraphProto):
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("g"):
                    yield from of_graph(attr.g)
                for sub in attr.graphs:
                    yield from of_graph(sub)
    yield from of_graph(model.graph)


def tensor_bytes(model: onnx.ModelProto) -> int:
    """Bytes of tensor data the model holds."""
    return sum(nbytes(t) for t in all_tensors(model))


def has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in all_tensors(model))


def nbytes(tensor: onnx.TensorProto) -> int:
    """Bytes of a tensor's data, from its dims and type (without touching the data, which may be large)."""
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return 0
    itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def _copy_fields(source, target, skip: str) -> None:
    for fd, value in source.ListFields():
        if fd.name == skip:
            continue
        if fd.is_repeated:
            getattr(target, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(target, fd.name).CopyFrom(value)
        else:
            setattr(target, fd.name, value)


def skeleton(model: onnx.ModelProto, threshold: int = EXTERNAL_THRESHOLD):
    """A copy of the model whose main-graph initializers of at least ``threshold`` bytes, or external, are
    stubs (name, type, dims, no data); returns (copy, [(original tensor, stub)]).

    Built without touching the large data (copying it costs seconds per GB): what shape inference, the
    checker and saving with external data need."""
    copy = onnx.ModelProto()
    _copy_fields(model, copy, skip="graph")
    _copy_fields(model.graph, copy.graph, skip="initializer")
    stubs = []
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL or nbytes(tensor) >= threshold:
            stub = copy.graph.initializer.add()
            stub.name, stub.data_type = tensor.name, tensor.data_type
            stub.dims.extend(tensor.dims)
            stubs.append((tensor, stub))
        else:
            copy.graph.initializer.add().CopyFrom(tensor)
    return copy, stubs


def _check_external_files(model: onnx.ModelProto, path: Path) -> None:
    for tensor in all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        data = path.parent / info.get("location", "")
        end = int(info.get("offset", 0)) + int(info.get("length", 0))
        if not data.is_file():
            raise InputError(f"{path}: external data file '{info.get('location', '')}' of tensor '{tensor.name}' "
                             f"is missing; keep the model's data files in the folder of the .onnx file")
        if data.stat().st_size < end:
            raise InputError(f"{path}: external data file '{data.name}' is truncated ({data.stat().st_size} bytes, "
                             f"tensor '{tensor.name}' ends at {end}); copy it again from the source")


def load_model(path) -> tuple[onnx.ModelProto, bool]:
    """Load and check an ONNX model with its external data; returns (model, whether it had external data).

    Raises InputError (one line) for a missing path, a file that is not ONNX, a truncated or corrupt file,
    missing external data."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file; give the path of an .onnx model")
    if not path.is_file():
        raise InputError(f"{path}: is not a file; give the path of an .onnx model")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: is empty; export the model again")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError) as err:
        raise InputError(f"{path}: is not an ONNX model or is truncated/corrupt ({_first_line(err)}); "
                         f"export it again") from None
    _check_external_files(model, path)
    external = has_external_data(model)
    checked, stubs = skeleton(model)  # the checker on the graph, its weights emptied: no second parse of the file
    for _, stub in stubs:
        del stub.dims[:]
        stub.dims.append(0)
    try:
        onnx.checker.check_model(checked)
    except (onnx.checker.ValidationError, RuntimeError, ValueError) as err:
        raise InputError(f"{path}: is not a valid ONNX model, it may be truncated or corrupt "
                         f"({_first_line(err)}); export it again") from None
    if external:
        onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
    return model, external


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def save_model(model: onnx.ModelProto, path, external_data: bool | None = None) -> list[Path]:
    """Write ``model`` to ``path`` atomically; returns the files written (the model, then its data file, if any).

    ``external_data=None`` chooses: external data exactly when the model would pass protobuf's 2 GB limit.
    The model object is left as it was."""
    path = Path(path)
    if not path.parent.is_dir():
        raise InputError(f"{path}: folder '{path.parent}' does not exist; create it or choose another output path")
    if external_data is None:
        external_data = tensor_bytes(model) > PROTOBUF_LIMIT - _HEADROOM
    data_path = path.with_name(path.name + ".data")
    workdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    written = []
    try:
        tmp_model = workdir / path.name
        if external_data:
            small, stubs = skeleton(model)
            _write_external(stubs, workdir / data_path.name)
            _write_proto(small, tmp_model)
            os.replace(workdir / data_path.name, data_path)
            written.append(data_path)
        else:
            _write_proto(model, tmp_model)
        os.replace(tmp_model, path)
        return [path] + written
    except BaseException:
        for done in written:
            done.unlink(missing_ok=True)
        raise
    finally:
        for leftover in workdir.iterdir():
            leftover.unlink()
        workdir.rmdir()


def _write_proto(model: onnx.ModelProto, path: Path) -> None:
    try:
        data = model.SerializeToString()
    except (ValueError, EncodeError) as err:  # protobuf refuses > 2 GB
        raise InputError(f"the model is too large to save in one file ({_first_line(err)}); "
                         f"save with external data") from None
    with open(path, "wb") as f:
        f.write(data)


def _write_external(stubs, data_path: Path) -> None:
    """Write each tensor's data to ``data_path`` and point its stub there (page-aligned, so runtimes can map it)."""
    offset = 0
    with open(data_path, "wb") as f:
        for tensor, stub in stubs:
            data = tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes()
            offset += -offset % 4096
            f.seek(offset)
            f.write(data)
            stub.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data_path.name), ("offset", str(offset)), ("length", str(len(data)))):
                entry = stub.external_data.add()
                entry.key, entry.value = key, value
            offset += len(data)


def write_text(path, text: str) -> Path:
    """Write a text file atomically (temporary file beside it, then rename)."""
    path = Path(path)
    if not path.parent.is_dir():
        raise InputError(f"{path}: folder '{path.parent}' does not exist; create it or choose another path")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
