"""Reading and writing ONNX models: clear errors for bad files, external data, atomic writes.

External data is not read at load (copying gigabytes costs seconds): each large external tensor keeps
pointing at its file, by absolute path, and is read when needed (``read_external``; the rewrites' constant
values, ``load_weights``) or copied file to file when saved. Small external tensors are read at load. So
the data files must stay as they are while a loaded model is in use, and such a model is saved with
``save_model`` (``onnx.save`` would keep the absolute paths).

A model is saved to a temporary file beside the target and renamed into place, so a failed or interrupted
save never leaves a partial output. Models whose tensors pass protobuf's 2 GB limit are saved with external
data (one ``<name>.data`` file beside the model), as are models that had external data when loaded.
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


def _external_info(tensor: onnx.TensorProto) -> tuple[str, int, int]:
    """(file, offset, length) of an external tensor."""
    info = {e.key: e.value for e in tensor.external_data}
    return info.get("location", ""), int(info.get("offset", 0)), int(info.get("length", nbytes(tensor)))


def read_external(tensor: onnx.TensorProto) -> bytes:
    """The data of an external tensor of a model loaded by ``load_model`` (its location is absolute)."""
    location, offset, length = _external_info(tensor)
    with open(location, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise InputError(f"external data file '{location}' changed since the model was loaded "
                         f"(tensor '{tensor.name}' is cut short); load the model again")
    return data


def _read_into_memory(tensor: onnx.TensorProto) -> None:
    tensor.raw_data = read_external(tensor)
    tensor.ClearField("data_location")
    del tensor.external_data[:]


def load_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """Read every external tensor of a model loaded by ``load_model`` into memory; returns the model."""
    for tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _read_into_memory(tensor)
    return model


def _point_external_data(model: onnx.ModelProto, folder: Path) -> None:
    """Make external locations absolute; read the small tensors and those outside the main graph's
    initializers (the rewrites read them as ordinary constants)."""
    for tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = str((folder / entry.value).resolve())
    main = {t.name for t in model.graph.initializer if nbytes(t) >= EXTERNAL_THRESHOLD}
    for tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL and tensor.name not in main:
            _read_into_memory(tensor)


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
        _point_external_data(model, path.parent)
    return model, external


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def save_model(model: onnx.ModelProto, path, external_data: bool | None = None) -> list[Path]:
    """Write ``model`` to ``path`` atomically; returns the files written (the model, then its data file, if any).

    ``external_data=None`` chooses: external data exactly when the model would pass protobuf's 2 GB limit.
    The model is left as it was, but that saving one without external data reads its external tensors in."""
    path = check_writable(path)
    if external_data is None:
        external_data = tensor_bytes(model) > PROTOBUF_LIMIT - _HEADROOM
    data_path = path.with_name(path.name + ".data")
    try:
        workdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    except OSError as err:
        raise InputError(f"{path}: cannot write there ({err.strerror}); choose another output path") from None
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
            _write_proto(load_weights(model), tmp_model)
        os.replace(tmp_model, path)
        return [path] + written
    except BaseException as err:
        for done in written:
            done.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise InputError(f"{path}: could not be written ({err.strerror or err}); nothing was saved, "
                             f"check the space and permissions there") from err
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
    """Write each tensor's data to ``data_path`` and point its stub there (page-aligned, so runtimes can map
    it). Data still in another file is copied file to file."""
    offset = 0
    with open(data_path, "wb") as f:
        for tensor, stub in stubs:
            offset += -offset % 4096
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                length = _copy_range(tensor, f, offset)
            else:
                data = tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes()
                f.seek(offset)
                f.write(data)
                length = len(data)
            stub.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", data_path.name), ("offset", str(offset)), ("length", str(length))):
                entry = stub.external_data.add()
                entry.key, entry.value = key, value
            offset += length


def _copy_range(tensor: onnx.TensorProto, out, at: int) -> int:
    """Copy an external tensor's bytes into ``out`` at offset ``at`` in the kernel; returns the length."""
    location, offset, length = _external_info(tensor)
    out.flush()
    with open(location, "rb") as source:
        done = 0
        try:
            while done < length:
                step = os.copy_file_range(source.fileno(), out.fileno(), length - done, offset + done, at + done)
                if step == 0:
                    break
                done += step
        except OSError:  # no in-kernel copy between these files: through memory
            source.seek(offset + done)
            out.seek(at + done)
            out.write(source.read(length - done))
            done = length
    if done != length:
        raise InputError(f"external data file '{location}' changed since the model was loaded "
                         f"(tensor '{tensor.name}' is cut short); load the model again")
    out.seek(at + length)
    return length


def check_writable(path) -> Path:
    """``path`` as a Path, if a file can be put there: its folder exists and it is not a folder itself."""
    path = Path(path)
    if not path.parent.is_dir():
        raise InputError(f"{path}: folder '{path.parent}' does not exist; create it or choose another path")
    if path.is_dir():
        raise InputError(f"{path}: is a folder; give a file path")
    return path


def write_text(path, text: str) -> Path:
    """Write a text file atomically (temporary file beside it, then rename)."""
    path = check_writable(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as err:
        raise InputError(f"{path}: cannot write there ({err.strerror}); choose another path") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise InputError(f"{path}: could not be written ({err.strerror or err})") from err
        raise
    return path
