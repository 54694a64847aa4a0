"""FP8 fusion of the sample models on the CPU (issue 13): the error of each FP8-fused sample against its float
original under onnxruntime, with the custom nodes on their numpy references (FP8 roundings emulated exactly).

Per sample: calibration from random inputs (``random:8``, max), from a file (an .npz of 8 samples, max and
percentile), the Q/DQ version Model Optimizer's pattern gives (built by tests/_fp8_models.py), and Model
Optimizer's own exports committed in tests/data. Columns: FP8 nodes of each op, and per output max_rel / rel_l2
(verification's measures; FP8 models pass at FP8_RTOL), and why the other sites are not FP8. Writes a markdown
table.

    python benchmarks/fp8_samples.py [--out benchmarks/results/fp8_samples_cpu.md]
"""
from __future__ import annotations

import argparse
import datetime
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the Q/DQ model builders of the FP8 tests

from _fp8_models import CONV_SAMPLES, FP8_ATTENTION_SAMPLES, conv_qdq_version, matmul_qdq_version, sample  # noqa: E402

from trt_fusedattn.pipeline import fuse  # noqa: E402
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION  # noqa: E402
from trt_fusedattn.plugins.conv.contract import FUSED_CONV  # noqa: E402
from trt_fusedattn.random_inputs import random_inputs  # noqa: E402
from trt_fusedattn.verification import verify  # noqa: E402

SAMPLES = ("bert_sdpa_hd64_torchscript", "bert_sdpa_hd64_dynamo", "llama_gqa_hd64_torchscript",
           "llama_gqa_hd64_fp16_torchscript", "vit_hd64_torchscript", "vit_dynamo", "resnet_dynamo",
           "resnet_bn_torchscript", "mobilenetv2_dynamo", "mobilenetv2_torchscript")
MODELOPT_EXPORTS = ("bert_hd64_modelopt_fp8", "vit_hd64_modelopt_fp8", "resnet_bn_modelopt_fp8")
VERIFY_SEED = 1234  # not a calibration input


def calibration_file(model: onnx.ModelProto, folder: Path, count: int = 8) -> str:
    """An .npz of ``count`` samples per graph input (stacked on a new axis 0), as a user would save them."""
    runs = [random_inputs(model, seed=100 + i) for i in range(count)]
    path = folder / "calib.npz"
    np.savez(path, **{name: np.stack([r[name] for r in runs]) for name in runs[0]})
    return str(path)


def fp8_nodes(fused: onnx.ModelProto) -> str:
    """'attention a/b, conv c/d': FP8 nodes of each op over all of its nodes."""
    parts = []
    for name, contract, key in (("attention", FUSED_ATTENTION, "q_scale"), ("conv", FUSED_CONV, "input_scale")):
        nodes = [n for n in fused.graph.node if contract.is_node(n)]
        if nodes:
            parts.append(f"{name} {sum(contract.node_attributes(n)[key] > 0 for n in nodes)}/{len(nodes)}")
    return ", ".join(parts) or "none fused"


def not_fp8(report) -> str:
    """The distinct reasons (node names dropped, shortened) why sites of ``report`` are not FP8: left unfused, or
    fused 16-bit; '-' where none is given (a Q/DQ model's unquantized sites)."""
    reasons = [re.sub(r"'[^']*' ", "", s.reason if not s.fused else s.details.get("fp8", "")[4:])
               for s in report.sites if not s.fused or str(s.details.get("fp8", "")).startswith("no:")]
    return "; ".join(sorted({r if len(r) <= 110 else r[:107] + "..." for r in reasons})) or "-"


def ways(name: str, folder: Path):
    """(how, original, (fused, report)) for each way of making ``name`` FP8."""
    model = sample(name)
    yield "calibrated random:8, max", model, fuse(model, precision="fp8", calibration="random:8")
    npz = calibration_file(model, folder)
    yield "calibrated file (8), max", model, fuse(model, precision="fp8", calibration=npz)
    yield "calibrated file (8), percentile", model, fuse(model, precision="fp8", calibration=npz,
                                                         calib_method="percentile")
    if name in CONV_SAMPLES:
        yield "Q/DQ (conv pattern)", model, fuse(conv_qdq_version(model))
    if name in FP8_ATTENTION_SAMPLES and name.endswith("torchscript"):  # dynamo's ONNX Attention has no P to quantize
        qdq = matmul_qdq_version(model)
        yield "Q/DQ (MatMul + Softmax pattern)", qdq, fuse(qdq)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fp8_samples_cpu.md"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        jobs = [(name, how, original, fused) for name in SAMPLES for how, original, fused in ways(name, Path(folder))]
    for export in MODELOPT_EXPORTS:
        original = onnx.load(ROOT / "tests" / "data" / f"{export}.onnx")
        jobs.append((export, "Model Optimizer export", original, fuse(original)))
    for name, how, original, (fused, report) in jobs:
        check = verify(original, fused, seed=VERIFY_SEED)
        errors = "; ".join(f"{o.name} {o.max_rel:.2g} / {o.rel_l2:.2g}" for o in check.outputs)
        verified = "yes" if check.passed else "NO"
        rows.append(f"| {name} | {how} | {fp8_nodes(fused)} | {errors} | {verified} | {not_fp8(report)} |")
        print(rows[-1], flush=True)
    lines = ["# FP8-fused samples vs their float originals (CPU, onnxruntime, custom nodes on their references)", "",
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; verification inputs: "
             f"random_inputs(seed={VERIFY_SEED}); FP8 nodes = nodes with FP8 scales / all nodes of the op; "
             "error per output: max_rel / rel_l2 (passes at FP8_RTOL 0.25).", "",
             "| sample | how | FP8 nodes | error vs original, per output | verified | sites not FP8: why |",
             "|---|---|---|---|---|---|",
             *rows]
    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
