"""Loading and saving: errors for bad files, external data both ways, atomic writes, models over 2 GB."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from _pipeline_models import SAMPLES, model_of, nothing_to_fuse
from trt_fusedattn import io, pipeline
from trt_fusedattn.errors import InputError

SAMPLE = Path(SAMPLES) / "resnet_torchscript.onnx"


def _weights(model):
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)


def test_round_trip_leaves_no_temporary_files(tmp_path):
    model = onnx.load(SAMPLE)
    written = io.save_model(model, tmp_path / "m.onnx")
    assert written == [tmp_path / "m.onnx"] and sorted(os.listdir(tmp_path)) == ["m.onnx"]
    loaded, external = io.load_model(tmp_path / "m.onnx")
    assert not external and _same_weights(loaded, model)


def test_external_data_round_trip_and_the_model_object_is_unchanged(tmp_path):
    model = onnx.load(SAMPLE)
    before = model.SerializeToString()
    written = io.save_model(model, tmp_path / "m.onnx", external_data=True)
    assert written == [tmp_path / "m.onnx", tmp_path / "m.onnx.data"]
    assert model.SerializeToString() == before
    assert (tmp_path / "m.onnx").stat().st_size < 100_000 < (tmp_path / "m.onnx.data").stat().st_size
    loaded, external = io.load_model(tmp_path / "m.onnx")
    assert external and any(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.graph.initializer)
    assert _same_weights(io.load_weights(loaded), model)


def test_size_decides_external_data(tmp_path, monkeypatch):
    model = onnx.load(SAMPLE)
    assert len(io.save_model(model, tmp_path / "small.onnx")) == 1
    monkeypatch.setattr(io, "PROTOBUF_LIMIT", io._HEADROOM + io.tensor_bytes(model) - 1)
    assert len(io.save_model(model, tmp_path / "large.onnx")) == 2


def test_failed_save_leaves_nothing(tmp_path, monkeypatch):
    def fail_midway(model, path):
        Path(path).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(io, "_write_proto", fail_midway)
    for external in (False, True):
        with pytest.raises(InputError, match="could not be written .disk full.; nothing was saved"):
            io.save_model(onnx.load(SAMPLE), tmp_path / "m.onnx", external_data=external)
        assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("case", ["missing", "folder", "empty", "text", "truncated", "garbled"])
def test_bad_files_raise_one_line_input_errors(tmp_path, case):
    path = tmp_path / "m.onnx"
    data = SAMPLE.read_bytes()
    if case == "folder":
        path.mkdir()
    elif case == "empty":
        path.write_bytes(b"")
    elif case == "text":
        path.write_text("this is not a model\n")
    elif case == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif case == "garbled":
        path.write_bytes(b"\xff" * 64 + data[64:])
    with pytest.raises(InputError) as err:
        io.load_model(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_missing_or_truncated_external_data(tmp_path):
    io.save_model(onnx.load(SAMPLE), tmp_path / "m.onnx", external_data=True)
    data = tmp_path / "m.onnx.data"
    content = data.read_bytes()
    data.write_bytes(content[: len(content) // 2])
    with pytest.raises(InputError, match="is truncated"):
        io.load_model(tmp_path / "m.onnx")
    data.unlink()
    with pytest.raises(InputError, match="m.onnx.data' of tensor .* is missing"):
        io.load_model(tmp_path / "m.onnx")


@pytest.mark.parametrize("opset", [11, 99])
def test_unsupported_opset(opset):
    model = nothing_to_fuse()
    model.opset_import[0].version = opset
    with pytest.raises(InputError, match=f"opset {opset} is not supported"):
        pipeline.fuse(model)


def test_model_over_2gb_loads_rewrites_and_saves_with_external_data(tmp_path):
    """Two 1.1 GB weights: saved with external data, loaded, through the pass, saved again with external data."""
    rows, cols = 2**18 + 2048, 1024  # 1.08 GB of float32 each
    rng = np.random.default_rng(0)
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])
    nodes = [helper.make_node("Gather", ["w0", "ids"], ["g0"]), helper.make_node("Gather", ["w1", "ids"], ["g1"]),
             helper.make_node("Add", ["g0", "g1"], ["y"])]
    model = model_of(nodes, [ids], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", cols])])
    probes = {}
    for name in ("w0", "w1"):
        weight = np.empty((rows, cols), np.float32)
        weight[:] = rng.standard_normal(cols, dtype=np.float32)
        weight[::4099] = rng.standard_normal((len(weight[::4099]), cols), dtype=np.float32)
        probes[name] = {i: weight[i].copy() for i in (0, 4099, rows - 1)}
        tensor = model.graph.initializer.add()  # built in place: protobuf cannot copy messages this large
        tensor.name, tensor.data_type = name, TensorProto.FLOAT
        tensor.dims.extend(weight.shape)
        tensor.raw_data = weight.tobytes()
        del weight
    io.save_model(model, tmp_path / "big.onnx")  # too large for one file: external data chosen
    del model, tensor
    assert (tmp_path / "big.onnx.data").stat().st_size > io.PROTOBUF_LIMIT
    fused, report = pipeline.fuse(tmp_path / "big.onnx")
    assert report.sites == [] and [n.op_type for n in fused.graph.node] == ["Gather", "Gather", "Add"]
    written = io.save_model(fused, tmp_path / "out.onnx")
    del fused
    assert written == [tmp_path / "out.onnx", tmp_path / "out.onnx.data"]
    loaded, external = io.load_model(tmp_path / "out.onnx")
    assert external
    for tensor in loaded.graph.initializer:
        weight = np.frombuffer(io.read_external(tensor), np.float32).reshape(tuple(tensor.dims))
        assert weight.shape == (rows, cols)
        for i, want in probes[tensor.name].items():
            np.testing.assert_array_equal(weight[i], want)


def test_fuse_leaves_the_callers_model_alone():
    model = onnx.load(SAMPLE)
    before = model.SerializeToString()
    fused, report = pipeline.fuse(model)
    assert model.SerializeToString() == before
    assert report.model == "<in memory>" and report.fused
    assert sum(n.op_type == "FusedConv" for n in fused.graph.node) == len(report.fused)
    assert fused.ir_version == model.ir_version and fused.producer_name == model.producer_name


@pytest.mark.parametrize("location", ["ABSOLUTE", "../outside/secret.bin", "link.bin", "/proc/self/environ"])
def test_load_model_keeps_external_data_inside_the_models_folder(tmp_path, location):
    """The API refuses what the CLI refuses (issue 15): nothing outside the model's folder is read."""
    from _hostile_models import SECRET, external, mlp

    folder, beside = tmp_path / "model", tmp_path / "outside"
    folder.mkdir()
    beside.mkdir()
    (beside / "secret.bin").write_bytes(SECRET)
    (folder / "link.bin").symlink_to(beside / "secret.bin")
    path = external(mlp(), folder, location=str(beside / "secret.bin") if location == "ABSOLUTE" else location)
    with pytest.raises(InputError, match="absolute path|outside the model's folder") as err:
        io.load_model(path)
    assert "\n" not in str(err.value)
    with pytest.raises(InputError):
        pipeline.fuse(path)


def test_external_data_in_a_subfolder_loads_and_relative_locations_are_not_read(tmp_path):
    from _hostile_models import external, mlp

    (tmp_path / "data").mkdir()
    path = external(mlp(), tmp_path, data="data/w.bin")
    model, had_external = io.load_model(path)
    assert had_external and io.data_files(model) == {(tmp_path / "data" / "w.bin").resolve()}
    assert _same_weights(io.load_weights(model), mlp())
    unchecked = onnx.load(path, load_external_data=False)  # locations as written: relative to some folder
    weight = next(t for t in unchecked.graph.initializer if t.data_location == TensorProto.EXTERNAL)
    with pytest.raises(InputError, match="relative path, which is not checked"):
        io.read_external(weight)


@pytest.mark.parametrize("dims,payload,message", [([64, 64], b"\0" * 100, "holds 100 bytes where it needs 16384"),
                                                  ([2**58, 64], b"\0" * 256, "holds 256 bytes"),
                                                  ([], None, "holds 3 values where it needs 1")])
def test_tensors_whose_data_does_not_match_their_shape_are_refused(tmp_path, dims, payload, message):
    model = nothing_to_fuse()
    weight = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=dims)
    if payload is None:
        weight.float_data.extend([1.0, 2.0, 3.0])
    else:
        weight.raw_data = payload
    model.graph.initializer[0].CopyFrom(weight)
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(InputError, match=message):
        io.load_model(tmp_path / "m.onnx")


def test_save_refuses_the_files_the_model_reads_and_an_unrelated_data_file(tmp_path):
    from _hostile_models import external, mlp

    model, _ = io.load_model(external(mlp(), tmp_path, name="a.onnx", data="b.onnx.data"))
    data_before = (tmp_path / "b.onnx.data").read_bytes()
    with pytest.raises(InputError, match="is a data file the model reads"):
        io.save_model(model, tmp_path / "b.onnx", external_data=True)
    assert (tmp_path / "b.onnx.data").read_bytes() == data_before
    (tmp_path / "c.onnx.data").write_bytes(b"not ours")
    with pytest.raises(InputError, match="is not the data file of c.onnx"):
        io.save_model(model, tmp_path / "c.onnx", external_data=True)
    assert (tmp_path / "c.onnx.data").read_bytes() == b"not ours"
    assert len(io.save_model(model, tmp_path / "d.onnx", external_data=True)) == 2
    assert len(io.save_model(model, tmp_path / "d.onnx", external_data=True)) == 2  # its own data file: replaced
    assert sorted(os.listdir(tmp_path)) == ["a.onnx", "b.onnx.data", "c.onnx.data", "d.onnx", "d.onnx.data"]


def test_staged_files_appear_only_when_published(tmp_path):
    staged = io.stage_model(onnx.load(SAMPLE), tmp_path / "m.onnx", external_data=True)
    assert [p.name for p in tmp_path.iterdir()] == [staged.workdir.name] and staged.path.is_file()
    assert staged.publish() == [tmp_path / "m.onnx", tmp_path / "m.onnx.data"]
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    with io.stage_text(tmp_path / "r.json", "{}"):
        pass  # left without publishing: discarded
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
