"""Never slower than TensorRT alone (issue 12, item 4): with a target arch the conv pass leaves to TensorRT each conv
its own fused conv runs faster there, from the measured rows first and the class rules second, and says why."""
from __future__ import annotations

import runpy
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

import _conv_graphs as graphs
from trt_fusedattn.errors import InputError
from trt_fusedattn.pipeline import fuse
from trt_fusedattn.plugins.conv import tensorrt_choice
from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.plugins.conv.tensorrt_choice import ConvShape, choose, measured_rows, write_measured
from trt_fusedattn.verification import verify

SAMPLES = Path(__file__).resolve().parents[1] / "models" / "samples"
LEFT = "left to TensorRT: its fused conv is faster for this shape on sm_90"


def ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def row(batch: int, fused_us: float, tensorrt_us: float, **shape) -> dict:
    """A measured row of the 3x3 4->6 conv of ``graphs.conv_case`` (X 2x4x9x8) unless ``shape`` says otherwise."""
    fields = dict(kernel=(3, 3), stride=(1, 1), channels=4, filters=6, groups=1, spatial=(9, 8), precision="fp16",
                  residual=False)
    fields.update(shape)
    return dict(fields, batch=batch, fused_us=fused_us, tensorrt_us=tensorrt_us, tensorrt_by="cuDNN fused graph",
                source="test run")


def test_dense_conv_is_left_to_tensorrt_on_sm90_and_fused_without_a_target():
    left, report = fuse(graphs.conv_case(), target="sm_90a")
    (site,) = report.sites
    assert not site.fused and site.reason.startswith(LEFT) and "issue 12" in site.reason
    assert site.details == {"left_to": "TensorRT", "target": "sm_90"}
    assert "Conv" in ops(left) and FUSED_CONV.name not in ops(left)
    fused, report = fuse(graphs.conv_case())
    assert report.sites[0].fused and FUSED_CONV.name in ops(fused) and "Conv" not in ops(fused)


def test_depthwise_conv_is_fused_on_sm90_with_its_evidence():
    fused, report = fuse(graphs.conv_case(channels=4, out_channels=4, group=4, pads=[1, 1, 1, 1]), target="sm_90")
    (site,) = report.sites
    assert site.fused and site.details["faster_than_tensorrt"].startswith("sm_90: depthwise")
    assert FUSED_CONV.name in ops(fused)


def test_arch_without_evidence_fuses_every_conv():
    _, report = fuse(graphs.conv_case(), target="sm_80")
    assert report.sites[0].fused and "faster_than_tensorrt" not in report.sites[0].details


@pytest.mark.parametrize("target", ["hopper", "sm_", ""])
def test_a_target_that_is_no_arch_is_a_one_line_input_error(target):
    with pytest.raises(InputError, match="is not a GPU arch"):
        fuse(graphs.conv_case(), target=target)


def test_cli_target_flag(tmp_path):
    model = tmp_path / "conv.onnx"
    onnx.save(graphs.conv_case(), model)
    run = lambda *flags: subprocess.run(["fuse-onnx", str(model), "-q", "-o", str(tmp_path / "out.onnx"), *flags],  # noqa: E731
                                        capture_output=True, text=True)
    done = run("--target", "sm_90a")
    assert done.returncode == 0, done.stderr
    assert "Conv" in ops(onnx.load(tmp_path / "out.onnx"))
    bad = run("--target", "volta")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "volta" in bad.stderr


def test_measured_rows_decide_before_the_rules(monkeypatch):
    monkeypatch.setattr(tensorrt_choice, "MEASURED", {"sm_90": [row(2, fused_us=5.0, tensorrt_us=9.0)]})
    _, report = fuse(graphs.conv_case(), target="sm_90a")
    assert report.sites[0].fused
    assert "cuDNN fused graph 9.0 µs vs FusedConv 5.0 µs at batch 2" in report.sites[0].details["faster_than_tensorrt"]
    monkeypatch.setattr(tensorrt_choice, "MEASURED", {"sm_90": [row(2, fused_us=9.0, tensorrt_us=5.0)]})
    _, report = fuse(graphs.conv_case(), target="sm_90a")
    assert not report.sites[0].fused and report.sites[0].reason.startswith(LEFT)
    assert "cuDNN fused graph 5.0 µs vs FusedConv 9.0 µs" in report.sites[0].reason
    monkeypatch.setattr(tensorrt_choice, "MEASURED", {"sm_90": [row(2, 5.0, 9.0, spatial=(56, 56))]})
    _, report = fuse(graphs.conv_case(), target="sm_90a")  # another spatial size is another shape: the rule decides
    assert not report.sites[0].fused and "dense FP16 convs" in report.sites[0].reason


def test_a_residual_chain_is_another_row(monkeypatch):
    """Same conv with and without the fused residual add: each is decided by its own measurement."""
    monkeypatch.setattr(tensorrt_choice, "MEASURED", {"sm_90": [row(2, 9.0, 5.0), row(2, 5.0, 9.0, residual=True)]})
    shape = dict(kernel=(3, 3), stride=(1, 1), channels=4, filters=6, groups=1, spatial=(9, 8), batch=2)
    assert choose(ConvShape(**shape), "sm_90a").to_tensorrt
    assert not choose(ConvShape(**shape, residual=True), "sm_90a").to_tensorrt


def test_static_batch_takes_the_nearest_measured_batch_and_dynamic_the_worst(monkeypatch):
    monkeypatch.setattr(tensorrt_choice, "MEASURED", {"sm_90": [row(8, 5.0, 9.0), row(32, 20.0, 15.0)]})
    shape = dict(kernel=(3, 3), stride=(1, 1), channels=4, filters=6, groups=1, spatial=(9, 8))
    assert not choose(ConvShape(**shape, batch=4), "sm_90a").to_tensorrt
    assert choose(ConvShape(**shape, batch=64), "sm_90a").to_tensorrt
    assert choose(ConvShape(**shape, batch=16), "sm_90a").to_tensorrt  # as near 8 as 32: the slower side decides
    assert choose(ConvShape(**shape, batch=None), "sm_90a").to_tensorrt
    assert choose(ConvShape(**dict(shape, spatial=None), batch=8), "sm_90a").evidence.startswith("cuDNN fused graph 9.0")


def test_fp8_rules_follow_the_filter():
    """Unmeasured FP8 shapes (a 40x40 image): the class rules, 3x3 fused at every batch (ResNet-50's measured 3x3 FP8
    rows 1.27-1.64x at batch 1, session 11 conv-3), other filters left to TensorRT; measured rows decide their own."""
    measured = ConvShape(kernel=(3, 3), stride=(1, 1), channels=64, filters=64, groups=1, spatial=(56, 56), batch=8,
                         precision="fp8")
    assert "µs at batch 8" in choose(measured, "sm_90a").evidence
    assert not choose(ConvShape(**dict(vars(measured), batch=1)), "sm_90a").to_tensorrt  # 4.1 vs 5.2 µs
    shape = dict(kernel=(3, 3), stride=(1, 1), channels=64, filters=64, groups=1, spatial=(40, 40), precision="fp8")
    for batch in (32, 8, 1, None):
        assert not choose(ConvShape(**shape, batch=batch), "sm_90a").to_tensorrt
    assert choose(ConvShape(**dict(shape, kernel=(1, 1)), batch=32), "sm_90a").to_tensorrt


def test_shortcut_left_to_tensorrt_keeps_the_add_with_the_main_chain_and_verifies(monkeypatch):
    """Projection block: the shortcut conv is left to TensorRT, the main chain's last conv (measured faster) still
    takes the Add, reading the shortcut's BatchNorm output as its residual; the result computes the original."""
    model = graphs.projection_case()
    main_last = row(2, 5.0, 9.0, kernel=(1, 1), channels=3, filters=8, spatial=(4, 4), residual=True)
    monkeypatch.setattr(tensorrt_choice, "MEASURED", {"sm_90": [main_last]})
    fused, report = fuse(model, target="sm_90a")
    fused_sites = [s for s in report.sites if s.fused]
    assert len(fused_sites) == 1 and fused_sites[0].details["residual"]
    assert len([s for s in report.sites if s.reason.startswith(LEFT)]) == 3
    assert ops(fused).count("Conv") == 3 and ops(fused).count(FUSED_CONV.name) == 1
    assert verify(model, fused, seed=3).passed


def test_mobilenet_sample_on_sm90_fuses_the_depthwise_convs_only():
    fused, report = fuse(onnx.load(SAMPLES / "mobilenetv2_dynamo.onnx"), target="sm_90a")
    fused_sites = [s for s in report.sites if s.fused]
    assert fused_sites and all(s.details["faster_than_tensorrt"].startswith("sm_90: depthwise") for s in fused_sites)
    assert all(s.shapes["W"][-1] == 1 for s in fused_sites)  # OHWI with one input channel per group
    assert all(s.reason.startswith(LEFT) for s in report.sites if not s.fused)
    assert ops(fused).count("Conv") == len(report.sites) - len(fused_sites)


def test_anchor_rows_become_the_measured_table(tmp_path):
    anchor = {"arch": "sm_90a", "environment": "H100 test", "rows": [
        dict(kernel=3, stride=2, c=128, k=128, hw=56, groups=1, batch=8, base_us=18.6, ours_us=13.46, graph_us=11.2,
             residual=False),
        dict(kernel=1, stride=1, c=16, k=96, hw=112, groups=1, batch=32, base_us=239.3, ours_us=57.8, graph_us=1981.9,
             residual=True),
        dict(kernel=3, stride=1, c=96, k=96, hw=56, groups=96, batch=8, base_us=9.0, ours_us=4.0, graph_us=None,
             residual=False)]}
    rows = measured_rows(anchor, "H100 test")
    assert rows == [dict(kernel=(3, 3), stride=(2, 2), channels=128, filters=128, groups=1, spatial=(56, 56), batch=8,
                         precision="fp16", residual=False, fused_us=13.46, tensorrt_us=11.2,
                         tensorrt_by="cuDNN fused graph",
                         source="H100 test"),
                    dict(kernel=(1, 1), stride=(1, 1), channels=16, filters=96, groups=1, spatial=(112, 112), batch=32,
                         precision="fp16", residual=True, fused_us=57.8, tensorrt_us=239.3,
                         tensorrt_by="cuDNN conv + separate epilogue ops", source="H100 test")]
    path = tmp_path / "measured.py"
    write_measured({"sm_90": rows}, path)
    assert runpy.run_path(str(path))["MEASURED"] == {"sm_90": rows}


def test_fp8_and_depthwise_times_of_an_anchor_row(tmp_path, monkeypatch):
    """A row with an FP8 time gives an fp8 row against the same FP16 stand-in for TensorRT; a depthwise row takes
    cuDNN's depthwise conv + activation where that is the fastest stand-in; a row's own source wins."""
    anchor = {"arch": "sm_90a", "environment": "H100 test", "rows": [
        dict(kernel=3, stride=1, c=256, k=256, hw=14, groups=1, batch=32, base_us=28.2, ours_us=21.3, graph_us=17.2,
             residual=False, fp8_us=11.0, dw_cudnn_us=None, source="run 2"),
        dict(kernel=3, stride=1, c=96, k=96, hw=56, groups=96, batch=8, base_us=9.0, ours_us=4.0, graph_us=50.0,
             residual=False, fp8_us=None, dw_cudnn_us=6.5)]}
    fp16, fp8, dw = measured_rows(anchor, "H100 test")
    assert (fp16["precision"], fp16["fused_us"], fp16["tensorrt_us"], fp16["source"]) == ("fp16", 21.3, 17.2, "run 2")
    assert (fp8["precision"], fp8["fused_us"], fp8["tensorrt_us"]) == ("fp8", 11.0, 17.2)
    assert {k: v for k, v in fp8.items() if k not in ("precision", "fused_us")} == \
        {k: v for k, v in fp16.items() if k not in ("precision", "fused_us")}
    assert (dw["tensorrt_us"], dw["tensorrt_by"], dw["source"]) == (6.5, "cuDNN depthwise conv + activation",
                                                                    "H100 test")
    path = tmp_path / "measured.py"
    write_measured({"sm_90": [fp16, fp8, dw]}, path)
    assert runpy.run_path(str(path))["MEASURED"] == {"sm_90": [fp16, fp8, dw]}
    monkeypatch.setattr(tensorrt_choice, "MEASURED", {"sm_90": [fp16, fp8]})
    shape = dict(kernel=(3, 3), stride=(1, 1), channels=256, filters=256, groups=1, spatial=(14, 14), batch=32)
    assert choose(ConvShape(**shape), "sm_90a").to_tensorrt  # the FP16 kernel is slower than the graph
    fp8_choice = choose(ConvShape(**shape, precision="fp8"), "sm_90a")
    assert not fp8_choice.to_tensorrt and "FusedConv 11.0 µs" in fp8_choice.evidence


def test_committed_measured_rows_are_well_formed():
    for arch, rows in tensorrt_choice.MEASURED.items():
        assert tensorrt_choice.table_arch(arch) == arch
        for r in rows:
            assert r["fused_us"] > 0 and r["tensorrt_us"] > 0 and r["precision"] in ("fp16", "fp8") and r["source"]
            assert r["tensorrt_by"] in [name for _, name in tensorrt_choice.TENSORRT_STAND_INS]
            assert np.prod(r["kernel"]) >= 1 and r["channels"] % r["groups"] == 0
