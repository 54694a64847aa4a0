"""``fuse-onnx`` end to end, through the installed console script: committed sample models fused and
verified, the report, external data, and bad input (one line on stderr, exit status, no output left)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest

from _pipeline_models import SAMPLES, nothing_to_fuse
from trt_fusedattn.contract import DOMAIN
from trt_fusedattn.tensorrt import available as tensorrt_available

# One sample of each kind (exporter, dtype, family, GQA, BatchNorm): the family tests (test_rewrite_*.py) fuse
# and verify every sample through the API; here the CLI does, end to end, within CI's time.
SAMPLE_MODELS = [Path(SAMPLES) / f"{name}.onnx" for name in
                 ("bert_sdpa_dynamo", "gpt2_eager_fp16_torchscript", "llama_gqa_torchscript", "resnet_bn_torchscript",
                  "vit_dynamo")]
CONV_SAMPLE = Path(SAMPLES) / "resnet_torchscript.onnx"


def fuse_onnx(*args, cwd=None):
    shutil.which("fuse-onnx") or pytest.fail("the fuse-onnx console script is not installed (pip install -e .)")
    return subprocess.run(["fuse-onnx", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)


def assert_one_line_error(result, code: int):
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fuse-onnx: error: "), result.stderr


@pytest.mark.parametrize("sample", SAMPLE_MODELS, ids=lambda p: p.stem)
def test_sample_models_fuse_and_verify(sample, tmp_path):
    out, report_path = tmp_path / "fused.onnx", tmp_path / "report.json"
    result = fuse_onnx(sample, "-o", out, "--verify", "--report", report_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(report_path.read_text())
    assert report["verification"]["passed"] and report["output"] == str(out)
    fused = onnx.load(out)
    custom = [n for n in fused.graph.node if n.domain == DOMAIN]
    assert len(custom) == sum(s["fused"] for s in report["sites"])
    assert all(s["fused"] or s["reason"] for s in report["sites"])  # every site left alone says why
    if custom:
        assert any(o.domain == DOMAIN and o.version == 1 for o in fused.opset_import)
    assert "max rel" in result.stdout and report["summary"] in result.stdout


def test_default_output_beside_the_input_and_quiet(tmp_path):
    model = tmp_path / "net.onnx"
    shutil.copy(CONV_SAMPLE, model)
    result = fuse_onnx(model, "-q")
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""
    assert (tmp_path / "net.fused.onnx").is_file()
    assert any(n.op_type == "FusedConv" for n in onnx.load(tmp_path / "net.fused.onnx").graph.node)


def test_only_selects_families(tmp_path):
    report = tmp_path / "r.json"
    assert fuse_onnx(CONV_SAMPLE, "-o", tmp_path / "o.onnx", "--only", "attention", "--report", report,
                     "-q").returncode == 0
    assert not any(s["family"] == "conv" for s in json.loads(report.read_text())["sites"])


def test_nothing_to_fuse_is_a_success_with_a_report(tmp_path):
    onnx.save(nothing_to_fuse(), tmp_path / "mlp.onnx")
    result = fuse_onnx(tmp_path / "mlp.onnx", "--verify", "--report", tmp_path / "r.json")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["sites"] == [] and report["verification"]["passed"]
    assert "nothing to fuse" in result.stdout
    assert [n.op_type for n in onnx.load(tmp_path / "mlp.fused.onnx").graph.node] == ["MatMul", "Add", "Relu"]


def test_external_data_in_external_data_out(tmp_path):
    model = onnx.load(CONV_SAMPLE)
    onnx.save(model, tmp_path / "ext.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0)
    result = fuse_onnx(tmp_path / "ext.onnx", "--verify", "-q")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "ext.fused.onnx.data").stat().st_size > 100_000
    fused = onnx.load(tmp_path / "ext.fused.onnx", load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in fused.graph.initializer)


def test_verification_failure_exits_1_and_writes_no_model(tmp_path):
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    result = fuse_onnx(CONV_SAMPLE, "-o", out, "--verify", "--rtol", "1e-12", "--report", report, "-q")
    assert_one_line_error(result, 1)
    assert "max relative error" in result.stderr and not out.exists()
    assert json.loads(report.read_text())["verification"]["passed"] is False


@pytest.mark.skipif(tensorrt_available()[0], reason="TensorRT's builder is installed here")
def test_engine_without_tensorrt_still_writes_the_fused_model(tmp_path):
    out = tmp_path / "o.onnx"
    result = fuse_onnx(CONV_SAMPLE, "-o", out, "--engine", tmp_path / "m.engine", "--fp16", "-q")
    assert_one_line_error(result, 3)
    assert "TensorRT" in result.stderr and "pip install" in result.stderr
    assert out.is_file() and not (tmp_path / "m.engine").exists()


def _write_bad_input(case: str, folder: Path) -> Path:
    path = folder / "model.onnx"
    data = CONV_SAMPLE.read_bytes()
    if case == "directory":
        path.mkdir()
    elif case == "not_onnx":
        path.write_text("name,value\na,1\n")
    elif case == "truncated":
        path.write_bytes(data[: len(data) * 2 // 3])
    elif case == "corrupt":
        path.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)))
    elif case == "missing_external_data":
        onnx.save(onnx.load(CONV_SAMPLE), path, save_as_external_data=True, location="w.bin", size_threshold=0)
        (folder / "w.bin").unlink()
    elif case == "old_opset":
        model = nothing_to_fuse()
        model.opset_import[0].version = 9
        onnx.save(model, path)
    return path


@pytest.mark.parametrize("case", ["missing", "directory", "not_onnx", "truncated", "corrupt",
                                  "missing_external_data", "old_opset"])
def test_bad_input_one_line_exit_2_no_output(case, tmp_path):
    path = _write_bad_input(case, tmp_path)
    before = sorted(os.listdir(tmp_path))
    result = fuse_onnx(path, "--verify", "--report", tmp_path / "r.json")
    assert_one_line_error(result, 2)
    assert "model.onnx" in result.stderr
    assert sorted(os.listdir(tmp_path)) == before  # no fused model, no report, no temporary file


@pytest.mark.parametrize("args,message", [(["--only", "attention,softmax"], "unknown rewrite family softmax"),
                                          (["-o", "no/such/dir/o.onnx"], "does not exist"),
                                          (["-o", "."], "is a folder"),
                                          (["--dim", "seq"], "expected NAME=SIZE")])
def test_bad_options_one_line_exit_2(args, message, tmp_path):
    result = fuse_onnx(CONV_SAMPLE.resolve(), *args, cwd=tmp_path)
    assert_one_line_error(result, 2)
    assert message in result.stderr and os.listdir(tmp_path) == []


def test_ci_runs_exactly_the_readme_commands():
    readme = Path("README.md").read_text()
    block = readme.split("## Two commands", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    install_and_sample, test = block.strip().splitlines()
    ci = Path(".ci/run").read_text().splitlines()
    assert install_and_sample in ci and test in ci
    assert "-c .ci/constraints.txt" in install_and_sample and "fuse-onnx models/samples/" in install_and_sample
    assert Path(install_and_sample.split("fuse-onnx ", 1)[1].split()[0]).is_file()


def test_verify_finds_sizes_the_original_runs_at_and_says_so(tmp_path):
    from _size_models import baked_sequence

    onnx.save(baked_sequence(), tmp_path / "m.onnx")
    result = fuse_onnx(tmp_path / "m.onnx", "--verify", "--report", tmp_path / "r.json", "-q")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verification"]["passed"] and report["verification"]["inputs"]["x"] == [8, 2, 8]
    assert report["verification"]["how"].startswith("the original does not run at x[17x2x8] (onnxruntime failed")
    assert (tmp_path / "m.fused.onnx").is_file()


def test_verify_that_cannot_run_the_original_still_writes_the_report(tmp_path):
    from _size_models import runs_at_no_size

    onnx.save(runs_at_no_size(), tmp_path / "m.onnx")
    result = fuse_onnx(tmp_path / "m.onnx", "--verify", "--report", tmp_path / "r.json", "-q")
    assert_one_line_error(result, 2)
    assert "the original model (not the fusion) does not run" in result.stderr and "--dim" in result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verification"]["original_error"] in result.stderr and not report["verification"]["passed"]
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "r.json"]  # no unverified model
