"""The pass's bookkeeping: the custom domain declared once, however many of its ops a fused model uses, and
a model fused twice still declares it once."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx

from trt_fusedattn.contract import DOMAIN
from trt_fusedattn.pipeline import fuse

SAMPLES = Path(__file__).resolve().parents[1] / "models" / "samples"


def test_custom_domain_is_declared_once_with_both_ops():
    fused, report = fuse(onnx.load(SAMPLES / "unet_dynamo.onnx"))
    assert {s.family for s in report.fused} == {"attention", "conv"}
    assert Counter(o.domain for o in fused.opset_import)[DOMAIN] == 1
    onnx.checker.check_model(fused)
    again, _ = fuse(fused)
    assert Counter(o.domain for o in again.opset_import)[DOMAIN] == 1
