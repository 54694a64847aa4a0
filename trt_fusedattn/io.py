"""Reading and writing ONNX models: clear errors for bad files, external data, atomic writes.

External data is not read at load (copying gigabytes costs seconds): each large external tensor keeps
pointing at its file, by absolute path, and is read when needed (``read_external``; the rewrites' constant
values, ``load_weights``) or copied file to file when saved. Small external tensors are read at load. So
the data files must stay as they are while a loaded model is in use, and such a model is saved with
``save_model`` (``onnx.save`` would keep the absolute paths).

Models come from elsewhere (hubs, other teams, customers), so loading trusts nothing in them: every
external-data location must name a regular file inside the model's folder (after resolving symlinks; no
absolute paths), its offset and length must fit that file and the tensor's byte size, and every tensor's
data must hold exactly the bytes its shape and type call for. Nothing is read before it passes.

A model is saved to a temporary folder beside the target and renamed into place, so a failed or interrupted
save never leaves a partial output; it never writes over a file the model reads, nor replaces a data file
that is not the old output's own. Models whose tensors pass protobuf's 2 GB limit are saved with external
data (one ``<name>.data`` file beside the model), as are models that had external data when loaded.
"""
from __future__ import annotations

import math
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Iterator

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, EncodeError
from onnx import helper, numpy_helper

from trt_fusedattn.errors import InputError, first_line

PROTOBUF_LIMIT = 2**31 - 1          # bytes a serialized ModelProto may hold
EXTERNAL_THRESHOLD = 1024           # tensors of at least this many bytes go to the data file
_HEADROOM = 256 * 2**20             # room left for the graph itself when deciding on external data


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of the model: initializers (sparse ones too) and tensor attributes, in subgraphs,
    functions and training info as well (any of them may point at external data)."""
    def of_sparse(sparse):
        yield sparse.values
        yield sparse.indices

    def of_nodes(nodes):
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("sparse_tensor"):
                    yield from of_sparse(attr.sparse_tensor)
                for sparse in attr.sparse_tensors:
                    yield from of_sparse(sparse)
                if attr.HasField("g"):
                    yield from of_graph(attr.g)
                for sub in attr.graphs:
                    yield from of_graph(sub)

    def of_graph(graph: onnx.GraphProto):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield from of_sparse(sparse)
        yield from of_nodes(graph.node)

    yield from of_graph(model.graph)
    for function in model.functions:
        yield from of_nodes(function.node)
    for info in model.training_info:
        yield from of_graph(info.initialization)
        yield from of_graph(info.algorithm)


def tensor_bytes(model: onnx.ModelProto) -> int:
    """Bytes of tensor data the model holds."""
    return sum(nbytes(t) for t in all_tensors(model))


def has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in all_tensors(model))


def _external_info(tensor: onnx.TensorProto) -> tuple[str, int, int]:
    """(file, offset, length) of an external tensor of a model loaded by ``load_model`` (checked there)."""
    info = {e.key: e.value for e in tensor.external_data}
    return info.get("location", ""), int(info.get("offset", 0)), int(info.get("length", nbytes(tensor)))


def read_external(tensor: onnx.TensorProto) -> bytes:
    """The data of an external tensor of a model loaded by ``load_model`` (its location is absolute)."""
    location, offset, length = _external_info(tensor)
    _require_loaded(tensor, location)
    with open(location, "rb") as f:
        f.seek(offset)
        data = f.read(length)
    if len(data) != length:
        raise InputError(f"external data file '{location}' changed since the model was loaded "
                         f"(tensor '{tensor.name}' is cut short); load the model again")
    return data


def _require_loaded(tensor: onnx.TensorProto, location: str) -> None:
    """Only locations ``load_model`` checked and made absolute are read: a relative one would be read
    against whatever the current folder is."""
    if not os.path.isabs(location):
        raise InputError(f"tensor '{tensor.name}' points at external data '{location}' by a relative path, "
                         f"which is not checked; load the model with load_model(path)")


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


def _point_external_data(model: onnx.ModelProto, locations: list[Path]) -> None:
    """Point external tensors (in ``all_tensors`` order) at their checked absolute files; read the small
    tensors and those outside the main graph's initializers (the rewrites read them as ordinary constants)."""
    external = (t for t in all_tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL)
    for tensor, location in zip(external, locations, strict=True):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = str(location)
    main = {t.name for t in model.graph.initializer if nbytes(t) >= EXTERNAL_THRESHOLD}
    for tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL and tensor.name not in main:
            _read_into_memory(tensor)


# Element types packed below a byte: bits per element (raw data holds ceil(count * bits / 8) bytes).
_PACKED_BITS = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4, onnx.TensorProto.FLOAT4E2M1: 4,
                onnx.TensorProto.INT2: 2, onnx.TensorProto.UINT2: 2,
                onnx.TensorProto.FLOAT6E2M3: 6, onnx.TensorProto.FLOAT6E3M2: 6}


def element_count(tensor: onnx.TensorProto) -> int:
    """Elements of a tensor by its dims (exact integer arithmetic: a hostile model may claim 2^60)."""
    return math.prod(tensor.dims)


def nbytes(tensor: onnx.TensorProto) -> int:
    """Bytes of a tensor's data, from its dims and type (without touching the data, which may be large)."""
    if tensor.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return 0
    count = element_count(tensor)
    if tensor.data_type in _PACKED_BITS:
        return -(-count * _PACKED_BITS[tensor.data_type] // 8)
    return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


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


_DIGITS = re.compile(r"[0-9]{1,19}")


def _external_file(tensor: onnx.TensorProto, path: Path, folder: Path) -> Path:
    """The checked data file of an external tensor: its location resolved against the model's folder,
    refused when absolute, outside the folder after resolving symlinks, not a regular file, or when its
    offset and length do not fit the file and the tensor's byte size."""
    info = {e.key: e.value for e in tensor.external_data}
    location, where = info.get("location", ""), f"{path}: tensor '{tensor.name[:200]}'"
    if not location or "\0" in location:
        raise InputError(f"{where} is external but names no data file; export the model again")
    if os.path.isabs(location):
        raise InputError(f"{where} points at external data by an absolute path ('{location[:200]}'), which is "
                         f"refused; keep data files in the model's folder and name them relative to it")
    try:
        data = (folder / location).resolve()
        inside = data.is_relative_to(folder)
        mode = data.stat().st_mode if inside else 0
    except FileNotFoundError:
        raise InputError(f"{path}: external data file '{location[:200]}' of tensor '{tensor.name[:200]}' is "
                         f"missing; keep the model's data files in the folder of the .onnx file") from None
    except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop
        raise InputError(f"{where}: external data file '{location[:200]}' cannot be read "
                         f"({getattr(err, 'strerror', None) or err}); check the model's data files") from None
    if not inside:
        raise InputError(f"{where} points at external data outside the model's folder ('{location[:200]}'), "
                         f"which is refused; keep data files in the model's folder")
    if not stat.S_ISREG(mode):
        raise InputError(f"{where}: external data '{location[:200]}' is not a regular file; "
                         f"give the model's data as a plain file in its folder")
    for key in ("offset", "length"):
        if key in info and not _DIGITS.fullmatch(info[key]):
            raise InputError(f"{where} has external-data {key} '{info[key][:40]}', not a byte count; "
                             f"export the model again")
    offset, length = int(info.get("offset", 0)), int(info.get("length", nbytes(tensor)))
    if length != nbytes(tensor):
        raise InputError(f"{where} claims {length} bytes of external data but its shape {list(tensor.dims)} "
                         f"and type need {nbytes(tensor)}; the model is corrupt, export it again")
    size = data.stat().st_size
    if offset + length > size:
        raise InputError(f"{path}: external data file '{data.name}' is truncated ({size} bytes, "
                         f"tensor '{tensor.name[:200]}' ends at {offset + length}); copy it again from the source")
    return data


def _check_in_memory_size(tensor: onnx.TensorProto, path: Path) -> None:
    """Refuse a tensor whose data does not hold exactly what its dims and type call for."""
    if any(d < 0 for d in tensor.dims):
        raise InputError(f"{path}: tensor '{tensor.name[:200]}' has a negative dimension {list(tensor.dims)}; "
                         f"the model is corrupt, export it again")
    count = element_count(tensor)
    if tensor.HasField("raw_data"):
        have, want = len(tensor.raw_data), {nbytes(tensor)}
    else:
        try:
            field = ("string_data" if tensor.data_type == onnx.TensorProto.STRING
                     else helper.tensor_dtype_to_field(tensor.data_type))
        except (KeyError, ValueError):
            raise InputError(f"{path}: tensor '{tensor.name[:200]}' has unknown element type {tensor.data_type}; "
                             f"export the model with a standard ONNX type") from None
        complex_parts = 2 if tensor.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128) else 1
        have, want = len(getattr(tensor, field)), {count * complex_parts}
        if tensor.data_type in _PACKED_BITS:
            want.add(nbytes(tensor))
    if have not in want:
        raise InputError(f"{path}: tensor '{tensor.name[:200]}' of shape {list(tensor.dims)} holds {have} "
                         f"{'bytes' if tensor.HasField('raw_data') else 'values'} where it needs {min(want)}; "
                         f"the model is corrupt, export it again")


def _check_tensors(model: onnx.ModelProto, path: Path) -> list[Path]:
    """Check every tensor's data (see ``_external_file``, ``_check_in_memory_size``); returns the data file
    of each external tensor, in ``all_tensors`` order."""
    folder = Path(os.path.abspath(path)).parent.resolve()
    files = []
    for tensor in all_tensors(model):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            if any(d < 0 for d in tensor.dims):
                _check_in_memory_size(tensor, path)
            files.append(_external_file(tensor, path, folder))
        else:
            _check_in_memory_size(tensor, path)
    return files


# ModelProto's fields: number -> protobuf wire type (0 varint, 2 length-delimited); fields a newer ONNX
# may add are let through with any valid wire type (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
_MODEL_FIELDS = {f.number: 2 if f.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE,
                                           FieldDescriptor.TYPE_BYTES) else 0
                 for f in onnx.ModelProto.DESCRIPTOR.fields}
_FIXED_BYTES = {1: 8, 5: 4}


def _looks_like_onnx(path: Path, size: int) -> bool:
    """Whether the file starts as a serialized ModelProto: its first fields are known ones of the right
    wire type and lengths within the file. Read from the head only, so a large file that is not ONNX is
    refused without reading it whole."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    pos, fields = 0, 0

    def varint():
        nonlocal pos
        value = shift = 0
        while pos < len(head) and shift < 64:
            byte = head[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        return None

    while pos < len(head) and fields < 16:
        tag = varint()
        if tag is None or tag >> 3 == 0 or _MODEL_FIELDS.get(tag >> 3, tag & 7) != tag & 7:
            return False
        if tag & 7 in _FIXED_BYTES:
            pos += _FIXED_BYTES[tag & 7]
        elif tag & 7 in (0, 2):
            value = varint()
            if value is None or (tag & 7 == 2 and pos + value > size):
                return False
            pos += value if tag & 7 == 2 else 0
        else:
            return False
        fields += 1
    return pos <= size


def _check_text(message, path: Path) -> None:
    """Refuse text fields (names, attributes, docs) that are not UTF-8: protobuf hands them out as bytes
    (or raises when decoding them), so a corrupt byte would otherwise surface deep inside the rewrites."""
    string, nested = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE
    pending = [message]
    try:
        while pending:
            for fd, value in pending.pop().ListFields():
                if fd.type == string:
                    bad = next((v for v in (value if fd.is_repeated else [value]) if not isinstance(v, str)), None)
                    if bad is not None:
                        raise InputError(f"{path}: holds text that is not UTF-8 ({fd.name} {bytes(bad)[:60]!r}), "
                                         f"so it is corrupt; export it again")
                elif fd.type == nested:
                    pending.extend(value if fd.is_repeated else [value])
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: holds text that is not UTF-8 ({err.reason} at byte {err.start}), so it is "
                         f"corrupt; export it again") from None


def load_model(path) -> tuple[onnx.ModelProto, bool]:
    """Load and check an ONNX model with its external data; returns (model, whether it had external data).

    Raises InputError (one line) for a missing or unreadable path, a file that is not ONNX, a truncated or
    corrupt file, tensors whose data does not match their shape, external data that is missing, outside
    the model's folder, not a regular file, or too short. Nothing outside the model's folder is read."""
    path = Path(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"{path}: is not a file; give the path of an .onnx model")
        if info.st_size == 0:
            raise InputError(f"{path}: is empty; export the model again")
        if not _looks_like_onnx(path, info.st_size):
            raise InputError(f"{path}: is not an ONNX model (its first bytes are not a ModelProto's); "
                             f"give the path of an .onnx file")
        model = onnx.load(str(path), load_external_data=False)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file; give the path of an .onnx model") from None
    except OSError as err:
        raise InputError(f"{path}: cannot be read ({err.strerror or err}); check the path and its "
                         f"permissions") from None
    except (DecodeError, RuntimeError, ValueError) as err:
        raise InputError(f"{path}: is not an ONNX model or is truncated/corrupt ({first_line(err)}); "
                         f"export it again") from None
    _check_text(model, path)
    files = _check_tensors(model, path)
    checked, stubs = skeleton(model)  # the checker on the graph, its weights emptied: no second parse of the file
    for _, stub in stubs:
        del stub.dims[:]
        stub.dims.append(0)
    try:
        onnx.checker.check_model(checked)
    except (onnx.checker.ValidationError, RuntimeError, ValueError) as err:
        raise InputError(f"{path}: is not a valid ONNX model, it may be truncated or corrupt "
                         f"({first_line(err)}); export it again") from None
    if files:
        _point_external_data(model, files)
    return model, bool(files)


def data_files(model: onnx.ModelProto) -> set[Path]:
    """The files the external tensors of a model loaded by ``load_model`` read."""
    return {Path(_external_info(t)[0]) for t in all_tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL}


class Staged:
    """Files written under temporary names in a hidden folder beside their target, put in place together by
    ``publish`` (a data file before its model, so a published model never points at a missing file) or
    removed by ``discard`` (also on leaving a ``with`` block: an error or a signal leaves nothing behind)."""

    def __init__(self, target: Path):
        self.target, self.moves = target, []
        try:
            self.workdir = Path(tempfile.mkdtemp(prefix=f".{target.name[:64]}.", dir=target.parent))
        except OSError as err:
            raise InputError(f"{target}: cannot write there ({err.strerror or err}); choose another path") from None

    def file(self, final: Path) -> Path:
        """The temporary path of ``final``; files are published in the order asked for."""
        self.moves.append((self.workdir / final.name, final))
        return self.moves[-1][0]

    @property
    def path(self) -> Path:
        """Where the target lies until published."""
        return self.workdir / self.target.name

    def publish(self) -> list[Path]:
        """Rename every file into place; returns them, the target first."""
        done = []
        try:
            for tmp, final in self.moves:
                os.replace(tmp, final)
                done.append(final)
        except OSError as err:
            for path in done:
                path.unlink(missing_ok=True)
            raise InputError(f"{self.target}: could not be written ({err.strerror or err}); nothing was saved, "
                             f"check the space and permissions there") from None
        finally:
            self.discard()
        return sorted(done, key=lambda p: p != self.target)

    def discard(self) -> None:
        if self.workdir is not None:
            for leftover in self.workdir.iterdir():
                leftover.unlink()
            self.workdir.rmdir()
            self.workdir = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.discard()


def stage_model(model: onnx.ModelProto, path, external_data: bool | None = None) -> Staged:
    """Write ``model`` for ``path`` (and ``path.data`` with external data) beside it, not yet in place.

    ``external_data=None`` chooses: external data exactly when the model would pass protobuf's 2 GB limit.
    Refuses a target the model reads (its data files) and an existing ``path.data`` that is not the data
    file of the model at ``path`` (an unrelated file is never replaced silently). The model is left as it
    was, but that saving one without external data reads its external tensors in."""
    path = check_writable(path)
    if external_data is None:
        external_data = tensor_bytes(model) > PROTOBUF_LIMIT - _HEADROOM
    data_path = path.with_name(path.name + ".data")
    targets = [path] + ([check_writable(data_path)] if external_data else [])
    for target in targets:
        if any(same_file(target, read) for read in data_files(model)):
            raise InputError(f"{target}: is a data file the model reads; writing it would change the input, "
                             f"choose another output path")
    if external_data and os.path.lexists(data_path) and not _uses_data_file(path, data_path.name):
        raise InputError(f"{data_path}: exists and is not the data file of {path.name}; saving would replace it, "
                         f"move it away or choose another output path")
    staged = Staged(path)
    try:
        if external_data:
            small, stubs = skeleton(model)
            _write_external(stubs, staged.file(data_path))
            _write_proto(small, staged.file(path))
        else:
            _write_proto(load_weights(model), staged.file(path))
    except BaseException as err:
        staged.discard()
        if isinstance(err, OSError):
            raise InputError(f"{path}: could not be written ({err.strerror or err}); nothing was saved, "
                             f"check the space and permissions there") from None
        raise
    return staged


def save_model(model: onnx.ModelProto, path, external_data: bool | None = None) -> list[Path]:
    """Write ``model`` to ``path`` atomically; returns the files written (the model, then its data file, if any).

    Same choices and refusals as ``stage_model``."""
    return stage_model(model, path, external_data).publish()


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (the same inode, or the same resolved path when either is new)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(os.path.abspath(a)).resolve() == Path(os.path.abspath(b)).resolve()


_OWN_OUTPUT_LIMIT = 64 * 2**20  # bytes: a model file that keeps its weights in a data file is small


def _uses_data_file(model_path: Path, data_name: str) -> bool:
    """Whether ``model_path`` is a model (saved with external data) whose tensors read ``data_name``."""
    try:
        if not model_path.is_file() or model_path.stat().st_size > _OWN_OUTPUT_LIMIT:
            return False
        model = onnx.load(str(model_path), load_external_data=False)
    except (OSError, DecodeError, RuntimeError, ValueError):
        return False
    return any(e.key == "location" and e.value == data_name
               for t in all_tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL for e in t.external_data)


def _write_proto(model: onnx.ModelProto, path: Path) -> None:
    try:
        data = model.SerializeToString()
    except (ValueError, EncodeError) as err:  # protobuf refuses > 2 GB
        raise InputError(f"the model is too large to save in one file ({first_line(err)}); "
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
    _require_loaded(tensor, location)
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


def check_writable(path, probe: bool = False) -> Path:
    """``path`` as a Path, if a file can be put there: its folder exists, and it is new or a regular file
    (a folder, symlink, device or pipe is refused: renaming onto it would replace it). ``probe``: also
    create and remove a temporary folder there, so an unwritable place fails before any work."""
    path = Path(path)
    try:
        if not path.parent.is_dir():
            raise InputError(f"{path}: folder '{path.parent}' does not exist; create it or choose another path")
        mode = path.lstat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as err:
        raise InputError(f"{path}: cannot write there ({err.strerror or err}); choose another path") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise InputError(f"{path}: is a folder; give a file path")
    if mode is not None and stat.S_ISLNK(mode):
        raise InputError(f"{path}: is a symbolic link, which writing would replace; give the path of a regular "
                         f"file or a new one")
    if mode is not None and not stat.S_ISREG(mode):
        raise InputError(f"{path}: is not a regular file (a device, pipe or socket), which writing would "
                         f"replace; give the path of a regular file or a new one")
    if probe:
        Staged(path).discard()
    return path


def stage_text(path, text: str) -> Staged:
    """A text file for ``path``, written beside it, not yet in place."""
    staged = Staged(check_writable(path))
    try:
        with open(staged.file(staged.target), "w") as f:
            f.write(text)
    except BaseException as err:
        staged.discard()
        if isinstance(err, OSError):
            raise InputError(f"{path}: could not be written ({err.strerror or err}); check the space and "
                             f"permissions there") from None
        raise
    return staged


def write_text(path, text: str) -> Path:
    """Write a text file atomically (temporary file beside it, then rename)."""
    return stage_text(path, text).publish()[0]
