"""Build the catalogue's architectures and export them with both torch exporters; optionally check each export
against torch under onnxruntime.

    python -m models.generate --out DIR [--only NAME ...] [--exporter torchscript|dynamo] [--fp16]
                              [--layers N --hidden H --heads A ...] [--check]
    python -m models.generate --out models/samples --samples
    python -m models.generate --out models/samples/fp8 --fp8-attention-samples
"""

from __future__ import annotations

import argparse
import inspect
import time
from functools import partial
from pathlib import Path

import torch

from models import architectures
from models.export import EXPORTERS, export, relative_error

CATALOGUE = {
    "bert_eager": partial(architectures.bert, "eager"),
    "bert_sdpa": partial(architectures.bert, "sdpa"),
    "gpt2": architectures.gpt2,
    "gpt2_eager": partial(architectures.gpt2, "eager"),
    "llama_gqa": architectures.llama_gqa,
    "llama_gqa_eager": partial(architectures.llama_gqa, "eager"),
    "bart": architectures.bart,
    "vit": architectures.vit,
    "resnet": architectures.resnet,
    "mobilenetv2": architectures.mobilenetv2,
    "deberta_v2": architectures.deberta_v2,
    "gemma2": architectures.gemma2,
    "mixtral": architectures.mixtral,
    "levit": architectures.levit,
    "unet": architectures.unet,
    "whisper_encoder": architectures.whisper_encoder,
    "torch_transformer": architectures.torch_transformer,
}
# The committed fp16 samples, (name, exporter). The TorchScript exporter writes an invalid model for BERT's and
# GPT-2's sdpa with a boolean mask in fp16 (float32 0/-inf mask added to fp16 scores), so those use eager attention.
FP16_SAMPLES = (("bert_eager", "torchscript"), ("gpt2_eager", "torchscript"), ("llama_gqa", "torchscript"),
                ("llama_gqa_eager", "torchscript"), ("bert_sdpa", "dynamo"), ("gpt2", "dynamo"),
                ("deberta_v2", "dynamo"), ("gemma2", "torchscript"), ("levit", "torchscript"), ("mixtral", "dynamo"),
                ("unet", "torchscript"), ("whisper_encoder", "torchscript"), ("torch_transformer", "dynamo"))
FP32_SAMPLES = tuple(name for name in CATALOGUE if name not in ("gpt2_eager", "llama_gqa_eager"))
# The FP8 attention samples (models/samples/fp8/, `<arch>_hd64[_fp16]_<exporter>.onnx`): the FP8 kernel takes head dims 64,
# 128 and 256 only (plugins/attention/plan.py), the other samples have heads of 16, so these have heads of 64.
# Outside models/samples/ itself, so the every-sample tests do not run them twice; tests/test_fp8_attention.py does.
# TorchScript's Softmax pattern (the one Q/DQ models quantize) for each; dynamo's ONNX Attention op once (BERT);
# a float16 export once (Llama-GQA: FP8 scales held in float16 by the QuantizeLinear nodes).
FP8_ATTENTION_SAMPLES = (("bert_sdpa", "torchscript"), ("bert_sdpa", "dynamo"), ("llama_gqa", "torchscript"),
                         ("vit", "torchscript"))
FP8_ATTENTION_FP16_SAMPLES = (("llama_gqa", "torchscript"),)
FP8_ATTENTION_CONFIG = {"bert_sdpa": dict(hidden=128, heads=2, intermediate=96, vocab=64, max_positions=64),
                        "llama_gqa": dict(hidden=128, heads=2, kv_heads=1, intermediate=128),
                        "vit": dict(hidden=64, heads=1)}  # ViT's MLP is 4x hidden: one head keeps it < 1 MB
# ResNet-152's layout, for `architectures.resnet(**RESNET152)`.
RESNET152 = dict(depths=(3, 8, 36, 3), hidden_sizes=(256, 512, 1024, 2048), embedding_size=64, image_size=224)


def build(name: str, dtype: torch.dtype = torch.float32, **overrides) -> architectures.Sample:
    """The catalogue's `name` with the config overrides its builder accepts (others are ignored)."""
    if name not in CATALOGUE:
        raise ValueError(f"unknown model {name!r}: choose from {', '.join(CATALOGUE)}")
    builder = CATALOGUE[name]
    accepted = inspect.signature(builder).parameters
    return builder(dtype=dtype, **{k: v for k, v in overrides.items() if k in accepted and v is not None})


def file_name(name: str, exporter: str, dtype: torch.dtype = torch.float32) -> str:
    """`<arch>[_fp16]_<exporter>.onnx`, the samples' naming."""
    precision = {torch.float32: "", torch.float16: "_fp16", torch.bfloat16: "_bf16"}[dtype]
    return f"{name}{precision}_{exporter}.onnx"


def _file_bytes(path: Path) -> int:
    """Size of the model file plus its external data file, if any."""
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def generate(out: str | Path, names=tuple(CATALOGUE), exporters=tuple(EXPORTERS), dtype: torch.dtype = torch.float32,
             check: bool = True, **overrides) -> list[dict]:
    """Export every (name, exporter) pair into `out`; one record per file with size, export seconds and (with
    `check`) the relative error of onnxruntime against torch."""
    records = []
    for name in names:
        sample = build(name, dtype, **overrides)
        for exporter in exporters:
            path = Path(out) / file_name(name, exporter, dtype)
            start = time.perf_counter()
            export(sample, path, exporter)
            record = {"file": str(path), "bytes": _file_bytes(path), "export_s": time.perf_counter() - start}
            if check:
                record["rel_err"] = relative_error(sample, path)
            records.append(record)
            print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()),
                  flush=True)
    return records


def fp8_attention_file(name: str, exporter: str, dtype: torch.dtype = torch.float32) -> str:
    """``<arch>_hd64[_fp16]_<exporter>.onnx``, the FP8 attention samples' naming."""
    return file_name(f"{name}_hd64", exporter, dtype)


def write_fp8_attention_samples(out: str | Path) -> list[dict]:
    """The FP8 attention samples (``FP8_ATTENTION_SAMPLES``, ``FP8_ATTENTION_FP16_SAMPLES``, checked) into ``out``."""
    records = []
    for name, exporter, dtype in [(n, e, torch.float32) for n, e in FP8_ATTENTION_SAMPLES] + \
            [(n, e, torch.float16) for n, e in FP8_ATTENTION_FP16_SAMPLES]:
        sample = build(name, dtype, **FP8_ATTENTION_CONFIG[name])
        path = export(sample, Path(out) / fp8_attention_file(name, exporter, dtype), exporter)
        records.append({"file": str(path), "bytes": _file_bytes(path), "rel_err": relative_error(sample, path)})
        print(records[-1], flush=True)
    return records


def write_samples(out: str | Path) -> list[dict]:
    """The committed sample set, all checked: every FP32_SAMPLES model with both exporters, FP16_SAMPLES, and
    resnet_bn_torchscript (ResNet exported without constant folding, so BatchNormalization nodes remain)."""
    records = generate(out, FP32_SAMPLES)
    for name, exporter in FP16_SAMPLES:
        records += generate(out, (name,), (exporter,), torch.float16)
    sample = build("resnet")
    path = export(sample, Path(out) / "resnet_bn_torchscript.onnx", "torchscript", fold_constants=False)
    records.append({"file": str(path), "bytes": _file_bytes(path), "rel_err": relative_error(sample, path)})
    print(records[-1], flush=True)
    return records


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for the .onnx files")
    parser.add_argument("--only", nargs="+", choices=list(CATALOGUE), default=list(CATALOGUE))
    parser.add_argument("--exporter", nargs="+", choices=list(EXPORTERS), default=list(EXPORTERS))
    parser.add_argument("--fp16", action="store_true", help="export in float16")
    parser.add_argument("--check", action="store_true", help="compare onnxruntime with torch on random inputs")
    parser.add_argument("--samples", action="store_true",
                        help="write exactly the committed sample set (models/samples/), ignoring the other options")
    parser.add_argument("--fp8-attention-samples", action="store_true",
                        help="write exactly the committed FP8 attention samples (models/samples/fp8/)")
    for option in ("layers", "hidden", "heads", "kv-heads", "intermediate", "vocab", "max-positions", "image-size",
                   "seed"):
        parser.add_argument(f"--{option}", type=int)
    parser.add_argument("--depths", type=int, nargs="+", help="ResNet blocks per stage, e.g. 3 8 36 3")
    parser.add_argument("--hidden-sizes", type=int, nargs="+", help="ResNet stage widths, e.g. 256 512 1024 2048")
    parser.add_argument("--embedding-size", type=int, help="ResNet stem width")
    args = parser.parse_args(argv)
    if args.samples:
        write_samples(args.out)
        return
    if args.fp8_attention_samples:
        write_fp8_attention_samples(args.out)
        return
    overrides = {k: v for k, v in vars(args).items()
                 if k not in ("out", "only", "exporter", "fp16", "check", "samples", "fp8_attention_samples")
                 and v is not None}
    for key in ("depths", "hidden_sizes"):
        if key in overrides:
            overrides[key] = tuple(overrides[key])
    generate(args.out, args.only, args.exporter, torch.float16 if args.fp16 else torch.float32, args.check,
             **overrides)


if __name__ == "__main__":
    main()
