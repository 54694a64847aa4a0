"""The model generators: fresh exports with each torch exporter have the expected structure and compute what torch
computes under onnxruntime; every committed sample in models/samples/ is what its generator's model computes."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the model generators need torch (pip install -e .[models])")
pytest.importorskip("transformers", reason="the model generators need transformers (pip install -e .[models])")

from models import generate  # noqa: E402
from models.export import export, op_counts, relative_error  # noqa: E402

SAMPLES_DIR = Path(__file__).resolve().parents[1] / "models" / "samples"
FP32_TOLERANCE, FP16_TOLERANCE = 1e-5, 1e-2


def _initializer_shapes(path: Path) -> list[tuple[int, ...]]:
    import onnx
    return [tuple(init.dims) for init in onnx.load(str(path)).graph.initializer]


def test_torchscript_bert_sdpa_is_matmul_softmax_per_layer(tmp_path):
    sample = generate.build("bert_sdpa", layers=3, hidden=48, heads=3)
    path = export(sample, tmp_path / "bert.onnx", "torchscript")
    ops = op_counts(path)
    assert ops.get("Softmax") == 3 and "Attention" not in ops
    assert ops.get("IsNaN") == 3, "the sdpa symbolic's fully-masked-row guard is expected once per layer"
    assert relative_error(sample, path) < FP32_TOLERANCE


def test_dynamo_bert_sdpa_emits_onnx_attention(tmp_path):
    sample = generate.build("bert_sdpa", layers=2, hidden=32, heads=2)
    path = export(sample, tmp_path / "bert.onnx", "dynamo")
    ops = op_counts(path)
    assert ops.get("Attention") == 2 and "Softmax" not in ops
    assert relative_error(sample, path, batch=2, seq=9) < FP32_TOLERANCE


def test_dynamo_resnet_bottleneck_conv_chain(tmp_path):
    sample = generate.build("resnet", depths=(2, 1, 1, 1))
    path = export(sample, tmp_path / "resnet.onnx", "dynamo")
    ops = op_counts(path)
    # stem + 5 blocks x 3 convs + 4 projection shortcuts (stage 1's second block has an identity shortcut)
    assert ops.get("Conv") == 1 + 5 * 3 + 4 and ops.get("Add") == 5
    assert "BatchNormalization" not in ops, "eval-mode BN is expected to be folded into the Conv weights"
    assert relative_error(sample, path, batch=1) < FP32_TOLERANCE


def test_torchscript_llama_keeps_grouped_kv_projections(tmp_path):
    sample = generate.build("llama_gqa", layers=1, hidden=64, heads=4, kv_heads=2)
    path = export(sample, tmp_path / "llama.onnx", "torchscript")
    shapes = _initializer_shapes(path)
    assert shapes.count((64, 32)) == 2, "K and V projections should map hidden 64 to 2 KV heads x 16"
    assert op_counts(path).get("Softmax") == 1
    assert relative_error(sample, path) < FP32_TOLERANCE


def test_unfolded_torchscript_resnet_keeps_batchnorm(tmp_path):
    sample = generate.build("resnet")
    path = export(sample, tmp_path / "resnet_bn.onnx", "torchscript", fold_constants=False)
    assert op_counts(path).get("BatchNormalization") == 17
    assert relative_error(sample, path) < FP32_TOLERANCE


def test_cli_applies_config_overrides(tmp_path):
    generate.main(["--out", str(tmp_path), "--only", "vit", "--exporter", "torchscript",
                   "--layers", "1", "--hidden", "16", "--heads", "4"])
    path = tmp_path / "vit_torchscript.onnx"
    assert op_counts(path).get("Softmax") == 1
    assert (16, 16) in _initializer_shapes(path)


def test_unknown_model_name_is_refused():
    with pytest.raises(ValueError, match="unknown model"):
        generate.build("resnet9000")


def _committed_samples() -> list[str]:
    return sorted(path.name for path in SAMPLES_DIR.glob("*.onnx"))


def test_committed_samples_are_the_documented_set():
    expected = {generate.file_name(name, exporter) for name in generate.FP32_SAMPLES for exporter in ("torchscript", "dynamo")}
    expected |= {generate.file_name(name, exporter, torch.float16) for name, exporter in generate.FP16_SAMPLES}
    expected.add("resnet_bn_torchscript.onnx")
    assert set(_committed_samples()) == expected


@pytest.mark.parametrize("file", _committed_samples())
def test_committed_sample_matches_its_generator(file):
    """Loads and runs in onnxruntime on fresh random inputs, and agrees with the seeded torch model it came from."""
    stem, _exporter = file.removesuffix(".onnx").rsplit("_", 1)
    fp16 = stem.endswith("_fp16")
    name = {"resnet_bn": "resnet"}.get(stem.removesuffix("_fp16"), stem.removesuffix("_fp16"))
    sample = generate.build(name, torch.float16 if fp16 else torch.float32)
    assert SAMPLES_DIR.joinpath(file).stat().st_size < 1_000_000
    assert relative_error(sample, SAMPLES_DIR / file, batch=2, seq=6, seed=11) < (FP16_TOLERANCE if fp16 else FP32_TOLERANCE)
