"""Bad and hostile inputs for ``fuse-onnx``, generated at test time (no committed binaries).

Each case builds its files in a fresh folder (the model's folder) next to an ``outside`` folder holding a
secret the model must never reach, and says how ``fuse-onnx`` must answer: the arguments, the exit status,
a phrase of the one-line error, and which files it may read or write.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from _pipeline_models import SAMPLES, fused_attention, model_of

WIDTH = 64                     # the MLP's weight is WIDTH x WIDTH float32: 16 KiB, over io.EXTERNAL_THRESHOLD
SECRET = b"SECRET-TOKEN-15!" * (WIDTH * WIDTH * 4 // 16)  # exactly the weight's byte size, so a read "fits"
CONV_SAMPLE = Path(SAMPLES) / "resnet_torchscript.onnx"


@dataclass
class Case:
    """One hostile input: ``fuse-onnx ARGS`` must exit ``code`` with ``phrase`` in its one error line."""

    args: list
    code: int
    phrase: str = ""
    outputs: list = field(default_factory=list)  # files it may write (besides staging folders beside them)
    deny: list = field(default_factory=list)     # files whose opening fails with EACCES (unreadable)


def mlp(width: int = WIDTH, batch="batch") -> onnx.ModelProto:
    """x @ W + b, Relu: nothing to fuse, one weight large enough to be external."""
    rng = np.random.default_rng(15)
    weights = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), "w"),
               numpy_helper.from_array(rng.standard_normal(width).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y0"]),
             helper.make_node("Relu", ["y0"], ["y"])]
    return model_of(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])], weights)


def external(model: onnx.ModelProto, folder: Path, name: str = "model.onnx", data: str = "weights.bin",
             **entries) -> Path:
    """Save ``model`` with its weight ``w`` external in ``data``, then set (or, with None, drop) its
    external-data ``entries`` (location, offset, length) as a hostile exporter would."""
    path = folder / name
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=data,
              size_threshold=1024)
    proto = onnx.load(path, load_external_data=False)
    tensor = next(t for t in proto.graph.initializer if t.name == "w")
    info = {e.key: e.value for e in tensor.external_data}
    info.update(entries)
    del tensor.external_data[:]
    for key, value in info.items():
        if value is not None:
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)
    path.write_bytes(proto.SerializeToString())
    return path


def _model(folder: Path, model: onnx.ModelProto, name: str = "model.onnx") -> Path:
    path = folder / name
    path.write_bytes(model.SerializeToString())
    return path


def _out(folder: Path) -> Path:
    return folder / "out.onnx"


def _fails(path: Path, phrase: str, *flags, code: int = 2) -> Case:
    return Case([path, "-o", path.parent / "out.onnx", "-q", *flags], code, phrase)


# --- external data that reaches out of the model's folder (issue 15, item 1) --------------------------------

def absolute_location(folder, outside):
    return _fails(external(mlp(), folder, location=str(outside / "secret.bin")), "absolute path", "--verify")


def proc_environ_no_length(folder, outside):
    return _fails(external(mlp(), folder, location="/proc/self/environ", length=None, offset=None),
                  "absolute path")


def traversal(folder, outside):
    return _fails(external(mlp(), folder, location="../outside/secret.bin"), "outside the model's folder", "--verify")


def traversal_without_verify(folder, outside):
    return _fails(external(mlp(), folder, location="../outside/secret.bin"), "outside the model's folder")


def symlink_out(folder, outside):
    (folder / "weights.link").symlink_to(outside / "secret.bin")
    return _fails(external(mlp(), folder, location="weights.link"), "outside the model's folder", "--verify")


def symlinked_subfolder(folder, outside):
    (folder / "sub").symlink_to(outside, target_is_directory=True)
    return _fails(external(mlp(), folder, location="sub/secret.bin"), "outside the model's folder")


def conv_model_traversal(folder, outside):
    """A model with convolutions to fuse, one weight pointing out of the folder."""
    model = onnx.load(CONV_SAMPLE)
    path = folder / "model.onnx"
    onnx.save(model, path, save_as_external_data=True, location="weights.bin", size_threshold=1024)
    proto = onnx.load(path, load_external_data=False)
    tensor = next(t for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL
                  and io_nbytes(t) <= len(SECRET))
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = "../outside/secret.bin"
        if entry.key == "offset":
            entry.value = "0"
    path.write_bytes(proto.SerializeToString())
    return _fails(path, "outside the model's folder", "--verify")


def io_nbytes(tensor) -> int:
    from trt_fusedattn.io import nbytes
    return nbytes(tensor)


def attribute_tensor_out(folder, outside):
    """A Constant node's tensor (not an initializer) pointing out of the folder."""
    value = numpy_helper.from_array(np.zeros(WIDTH, np.float32), "c")
    value.data_location = TensorProto.EXTERNAL
    value.ClearField("raw_data")
    for key, v in (("location", "../outside/secret.bin"), ("length", str(WIDTH * 4))):
        entry = value.external_data.add()
        entry.key, entry.value = key, v
    model = mlp()
    model.graph.node.insert(0, helper.make_node("Constant", [], ["c"], value=value))
    model.graph.node[-1].CopyFrom(helper.make_node("Add", ["y0", "c"], ["y"]))
    return _fails(_model(folder, model), "outside the model's folder", "--verify")


def sparse_initializer_out(folder, outside):
    values = numpy_helper.from_array(np.ones(4, np.float32), "s_values")
    values.data_location = TensorProto.EXTERNAL
    values.ClearField("raw_data")
    entry = values.external_data.add()
    entry.key, entry.value = "location", str(outside / "secret.bin")
    indices = numpy_helper.from_array(np.array([0, 5, 9, 12], np.int64), "s_indices")
    model = mlp()
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [16]))
    return _fails(_model(folder, model), "absolute path")


# --- external data that is broken (items 1, 6, 7) ---------------------------------------------------------------

def fifo_location(folder, outside):
    os.mkfifo(folder / "weights.fifo")
    return _fails(external(mlp(), folder, location="weights.fifo"), "not a regular file", "--verify")


def folder_location(folder, outside):
    (folder / "weights.d").mkdir()
    return _fails(external(mlp(), folder, location="weights.d"), "not a regular file")


def negative_offset(folder, outside):
    return _fails(external(mlp(), folder, offset=-100), "offset '-100', not a byte count", "--verify")


def text_offset(folder, outside):
    return _fails(external(mlp(), folder, offset="abc"), "offset 'abc', not a byte count")


def length_not_the_tensors(folder, outside):
    return _fails(external(mlp(), folder, length=100), "claims 100 bytes")


def past_the_end(folder, outside):
    return _fails(external(mlp(), folder, offset=4096), "is truncated", "--verify")


def no_location(folder, outside):
    return _fails(external(mlp(), folder, location=None), "names no data file")


def long_location(folder, outside):
    return _fails(external(mlp(), folder, location="w" * 300), "cannot be read")


# --- tensors whose data does not match their shape (item 7) ----------------------------------------------------

def _with_weight(tensor: onnx.TensorProto) -> onnx.ModelProto:
    model = mlp()
    model.graph.initializer[0].CopyFrom(tensor)
    return model


def short_weight(folder, outside):
    weight = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[WIDTH, WIDTH], raw_data=b"\1" * 100)
    return _fails(_model(folder, _with_weight(weight)), "holds 100 bytes", "--verify")


def huge_claimed_embedding(folder, outside):
    rows = 2**60 // WIDTH
    table = onnx.TensorProto(name="table", data_type=TensorProto.FLOAT, dims=[rows, WIDTH], raw_data=b"\0" * 256)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["y"])]
    model = model_of(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", WIDTH])], [table])
    return _fails(_model(folder, model), "holds 256 bytes")


def scalar_with_three_values(folder, outside):
    model = mlp()
    scale = onnx.TensorProto(name="scale", data_type=TensorProto.FLOAT, dims=[], float_data=[1.0, 2.0, 3.0])
    model.graph.initializer.append(scale)
    model.graph.node[-1].CopyFrom(helper.make_node("Mul", ["y0", "scale"], ["y"]))
    return _fails(_model(folder, model), "holds 3 values", "--verify")


def negative_dim(folder, outside):
    weight = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[-1, WIDTH], raw_data=b"")
    return _fails(_model(folder, _with_weight(weight)), "negative dimension")


# --- the model file itself (items 6, 9) -------------------------------------------------------------------------

def unreadable_model(folder, outside):
    path = _model(folder, mlp())
    case = _fails(path, "cannot be read")
    case.deny = [path]
    return case


def long_model_name(folder, outside):
    return _fails(folder / ("m" * 300 + ".onnx"), "cannot be read")


def long_output_name(folder, outside):
    path = _model(folder, mlp(), name="m" * 250 + ".onnx")  # default output m...m.fused.onnx: 256 bytes
    return Case([path, "-q"], 2, "cannot write there")


def large_file_not_onnx(folder, outside):
    """3 GB (sparse) that is not ONNX: refused from its first bytes, not read whole."""
    path = folder / "model.onnx"
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04 a zip archive, not a model")
        f.truncate(3 * 2**30)
    return _fails(path, "is not an ONNX model")


def fifo_model(folder, outside):
    path = folder / "model.onnx"
    os.mkfifo(path)
    return _fails(path, "is not a file")


# --- outputs that would overwrite inputs or each other, or non-regular targets (items 2, 3, 4) -----------------

def output_is_the_input(folder, outside):
    path = _model(folder, mlp())
    return Case([path, "-o", path], 2, "is a file the input model reads")


def output_data_is_the_inputs_data(folder, outside):
    """a.onnx keeps its weights in b.onnx.data; ``-o b.onnx`` would write b.onnx.data."""
    path = external(mlp(), folder, name="a.onnx", data="b.onnx.data")
    return Case([path, "-o", folder / "b.onnx", "--verify"], 2, "is a file the input model reads")


def unrelated_output_data(folder, outside):
    path = external(mlp(), folder)
    (folder / "out.onnx.data").write_bytes(b"someone else's weights")
    return _fails(path, "is not the data file of out.onnx")


def report_is_the_model(folder, outside):
    path = _model(folder, mlp())
    return _fails(path, "is a file the input model reads", "--report", path)


def report_is_the_output(folder, outside):
    path = _model(folder, mlp())
    return _fails(path, "name the same file", "--report", folder / "out.onnx")


def engine_is_the_report(folder, outside):
    path = _model(folder, mlp())
    return _fails(path, "name the same file", "--report", folder / "r.json", "--engine", folder / "r.json")


def output_is_a_symlink(folder, outside):
    path = _model(folder, mlp())
    (folder / "out.onnx").symlink_to(outside / "target.onnx")
    return _fails(path, "is a symbolic link")


def report_is_a_symlink(folder, outside):
    path = _model(folder, mlp())
    (folder / "r.json").symlink_to(outside / "target.json")
    return _fails(path, "is a symbolic link", "--report", folder / "r.json")


def output_is_a_fifo(folder, outside):
    path = _model(folder, mlp())
    os.mkfifo(folder / "out.onnx")
    return _fails(path, "not a regular file")


def report_is_a_fifo(folder, outside):
    path = _model(folder, mlp())
    os.mkfifo(folder / "r.json")
    return _fails(path, "not a regular file", "--report", folder / "r.json")


def report_unwritable(folder, outside):
    """A report that cannot be written fails before the model is written."""
    return _fails(_model(folder, mlp()), "cannot write there", "--report", "/proc/fuse-onnx-report.json")


# --- flags (items 6, 9) ------------------------------------------------------------------------------------------

def _flags(*flags, phrase):
    def case(folder, outside):
        return _fails(_model(folder, mlp()), phrase, *flags)
    case.__name__ = "flags_" + "_".join(f.strip("-").replace("=", "_") for f in flags)
    return case


FLAG_CASES = [
    _flags("--verify", "--seed", "-1", phrase="not a seed"),
    _flags("--verify", "--rtol", "inf", phrase="not a finite tolerance"),
    _flags("--verify", "--rtol", "nan", phrase="not a finite tolerance"),
    _flags("--verify", "--atol", "-1", phrase="not a finite tolerance"),
    _flags("--verify", "--dim", "batch=99999999999", phrase="expected NAME=SIZE"),
    _flags("--verify", "--dim", "sequence=8", phrase="no dimension of that name"),
    _flags("--verify", "--dim", "batch=2", "--dim", "batch=3", phrase="given twice"),
    _flags("--only", ",", phrase="names no rewrite family"),
    _flags("--fp16", phrase="add --engine"),
    _flags("--verify", "--dim", "batch=100000000", phrase="over the 1 GiB limit"),
]


# --- verification (items 3, 5, 6, 9) ------------------------------------------------------------------------------

def enormous_static_dims(folder, outside):
    model = mlp(batch=2**24)  # a 4 GiB input: refused before allocating
    return _fails(_model(folder, model), "its dims are static", "--verify")


def zero_size_dim_verifies(folder, outside):
    return Case([_model(folder, mlp(batch=0)), "-o", _out(folder), "--verify", "-q"], 0,
                outputs=[_out(folder)])


def string_output_verifies(folder, outside):
    nodes = [helper.make_node("Identity", ["s"], ["t"]), helper.make_node("Relu", ["x"], ["y"])]
    model = model_of(nodes, [helper.make_tensor_value_info("s", TensorProto.STRING, ["n"]),
                             helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                     [helper.make_tensor_value_info("t", TensorProto.STRING, ["n"]),
                      helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    return Case([_model(folder, model), "-o", _out(folder), "--verify", "-q"], 0, outputs=[_out(folder)])


def type_conflict(folder, outside):
    model = mlp()
    model.graph.value_info.append(helper.make_tensor_value_info("xw", TensorProto.INT64, ["batch", WIDTH]))
    return _fails(_model(folder, model), "does not match", "--verify")


def _custom(folder, change: Callable[[onnx.ModelProto], None], phrase: str):
    model = fused_attention()
    change(model)
    return _fails(_model(folder, model), phrase, "--verify")


def custom_node_bad_attribute(folder, outside):
    def change(model):
        model.graph.node[0].attribute.append(helper.make_attribute("layout", "XYZ"))
        del model.graph.node[0].attribute[0]  # the node's own layout, now replaced
    return _custom(folder, change, "layout='XYZ' is not one of")


def custom_node_unknown_version(folder, outside):
    def change(model):
        next(o for o in model.opset_import if o.domain == "trt_fusedattn").version = 7
    return _custom(folder, change, "opset 7")


def custom_node_too_few_inputs(folder, outside):
    return _custom(folder, lambda model: model.graph.node[0].input.pop(), "it takes 3 to")


def custom_node_unknown_op(folder, outside):
    def change(model):
        model.graph.node[0].op_type = "FusedSoftmax"
    return _custom(folder, change, "an op this version does not know")


def custom_node_wrong_head_dims(folder, outside):
    """Passes every check before the run, fails inside the reference: once an abort (exit 134)."""
    def change(model):
        model.graph.input[1].type.tensor_type.shape.dim[3].dim_value = 4  # K's head dim 4, Q's 8
    return _custom(folder, change, "a custom node failed")


# --- controls: well-formed inputs go through, so the refusals above are not refusing everything ---------------

def external_data_inside_verifies(folder, outside):
    (folder / "data").mkdir()
    path = external(mlp(), folder, data="data/weights.bin")
    return Case([path, "-o", _out(folder), "--verify", "-q"], 0,
                outputs=[_out(folder), folder / "out.onnx.data"])


def rerun_replaces_its_own_output(folder, outside):
    path = external(mlp(), folder)
    from trt_fusedattn.cli import main
    assert main([str(path), "-o", str(_out(folder)), "-q"]) == 0  # the first run: its own out.onnx.data
    return Case([path, "-o", _out(folder), "-q", "--report", folder / "r.json"], 0,
                outputs=[_out(folder), folder / "out.onnx.data", folder / "r.json"])


CASES = [absolute_location, proc_environ_no_length, traversal, traversal_without_verify, symlink_out,
         symlinked_subfolder, conv_model_traversal, attribute_tensor_out, sparse_initializer_out,
         fifo_location, folder_location, negative_offset, text_offset, length_not_the_tensors, past_the_end,
         no_location, long_location, short_weight, huge_claimed_embedding, scalar_with_three_values, negative_dim,
         unreadable_model, long_model_name, long_output_name, large_file_not_onnx, fifo_model, output_is_the_input,
         output_data_is_the_inputs_data, unrelated_output_data, report_is_the_model, report_is_the_output,
         engine_is_the_report, output_is_a_symlink, report_is_a_symlink, output_is_a_fifo, report_is_a_fifo,
         report_unwritable, *FLAG_CASES, enormous_static_dims, zero_size_dim_verifies, string_output_verifies,
         type_conflict, custom_node_bad_attribute, custom_node_unknown_version, custom_node_too_few_inputs,
         custom_node_unknown_op, custom_node_wrong_head_dims, external_data_inside_verifies,
         rerun_replaces_its_own_output]
