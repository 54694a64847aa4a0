"""Which convolutions to leave to TensorRT on a target GPU arch: where TensorRT's own fused conv (measured as the
cuDNN frontend fused graph conv -> bias -> [add] -> activation, benchmarks/conv_anchor.py) is faster than FusedConv,
an engine with our plugin would be slower than one without it, so the pass leaves that Conv unfused (issue 12,
item 4). Evidence per arch: measured shapes (``tensorrt_choice_measured``, written from an anchor run by
``python -m trt_fusedattn.plugins.conv.tensorrt_choice --from-anchor ROWS.json``) first, then the class rules below.
"""
from __future__ import annotations

import argparse
import json
import math
import pprint
from dataclasses import dataclass
from pathlib import Path

from trt_fusedattn.plugins.conv.tensorrt_choice_measured import MEASURED
from trt_fusedattn.plugins.tensorrt_choice import Choice, table_arch

OP = "conv"  # what the report says TensorRT's own fusion runs instead

# Class rules per arch, first match wins, used where no measured row has the shape. A rule matches on precision
# ("fp16" covers float16/bfloat16 FusedConvs, "fp8" the e4m3 ones), depthwise (groups == channels > 1), and
# optionally kernel and min_batch (a static batch at least this; a dynamic batch never satisfies it).
RULES = {
    "sm_90": [
        dict(precision="fp16", depthwise=True, choice="fused",
             evidence="depthwise + activation: FusedConv 1.39-3.48x cuDNN's depthwise conv (BatchNorm folded) + "
                      "activation, cuDNN's fused graph slower still (H100, 2026-11-25 session 11 conv-3, issue 12)"),
        dict(precision="fp16", depthwise=False, choice="tensorrt",
             evidence="dense FP16 convs: FusedConv 0.71-1.55x the cuDNN fused graph per ResNet-50 layer, stack 1.06x "
                      "(b1) 1.09x (b8) 1.08x (b32) (H100, 2026-11-25 session 11 conv-3, issue 12)"),
        dict(precision="fp8", depthwise=False, kernel=(3, 3), choice="fused",
             evidence="FP8 3x3: FusedConv with e4m3 activations 1.27-1.64x the fused FP16 cuDNN graph at batch 1, "
                      "1.29-1.58x at 8, 1.21-1.57x at 32 (H100, 2026-11-25 session 11 conv-3, issue 12)"),
        dict(precision="fp8", depthwise=False, choice="tensorrt",
             evidence="FP8 other than 3x3: not measured faster than TensorRT's fused FP16 conv (H100, issue 12)"),
    ],
}


@dataclass(frozen=True)
class ConvShape:
    """What the rewrite knows statically about one conv: filter, stride, channels, groups; spatial size and batch
    where the model's dims are static (None where dynamic); the FusedConv's precision ("fp16" or "fp8"); whether
    the chain adds a residual (the fused add saves TensorRT a read and a write of the output: another row)."""

    kernel: tuple
    stride: tuple
    channels: int
    filters: int
    groups: int
    spatial: tuple | None = None
    batch: int | None = None
    precision: str = "fp16"
    residual: bool = False

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.channels


def choose(shape: ConvShape, target: str) -> Choice | None:
    """Fuse or leave to TensorRT, for ``shape`` on ``target``; None when the arch has no evidence at all."""
    arch = table_arch(target)
    if arch not in RULES and arch not in MEASURED:
        return None
    measured = _measured_choice(shape, arch)
    if measured is not None:
        return measured
    for rule in RULES.get(arch, []):
        if _rule_matches(rule, shape):
            return Choice(arch, rule["choice"] == "tensorrt", rule["evidence"], OP)
    return Choice(arch, False, "no measurement or rule covers this shape: fused", OP)


def _rule_matches(rule: dict, shape: ConvShape) -> bool:
    if rule["precision"] != shape.precision or rule["depthwise"] != shape.depthwise:
        return False
    if "kernel" in rule and tuple(rule["kernel"]) != tuple(shape.kernel):
        return False
    return "min_batch" not in rule or (shape.batch is not None and shape.batch >= rule["min_batch"])


def _measured_choice(shape: ConvShape, arch: str) -> Choice | None:
    """From the measured rows of this exact layer (same filter, stride, channels, groups, precision, residual, and
    spatial size where static): at a static batch the nearest measured batch decides; at a dynamic batch TensorRT takes
    the conv if it is faster at any measured batch (never slower at any size the engine may run)."""
    rows = [r for r in MEASURED.get(arch, [])
            if (tuple(r["kernel"]), tuple(r["stride"]), r["channels"], r["filters"], r["groups"], r["precision"])
            == (tuple(shape.kernel), tuple(shape.stride), shape.channels, shape.filters, shape.groups, shape.precision)
            and r["residual"] == shape.residual
            and (shape.spatial is None or tuple(r["spatial"]) == tuple(shape.spatial))]
    if not rows:
        return None
    if shape.batch is not None:
        nearest = min(abs(math.log2(r["batch"] / shape.batch)) for r in rows)
        rows = [r for r in rows if abs(math.log2(r["batch"] / shape.batch)) == nearest]
    worst = min(rows, key=lambda r: r["tensorrt_us"] / r["fused_us"])
    return Choice(arch, worst["tensorrt_us"] < worst["fused_us"],
                  f"{worst['tensorrt_by']} {worst['tensorrt_us']:.1f} µs vs FusedConv {worst['fused_us']:.1f} µs at "
                  f"batch {worst['batch']}; {worst['source']}", OP)


# What stands for TensorRT's own conv in an anchor row: (row key, how the report names it).
TENSORRT_STAND_INS = (("graph_us", "cuDNN fused graph"), ("base_us", "cuDNN conv + separate epilogue ops"),
                      ("dw_cudnn_us", "cuDNN depthwise conv + activation"))


def measured_rows(anchor: dict, source: str) -> list[dict]:
    """The rows of a ``benchmarks/conv.py --json`` run that have both times, in this table's form (a row's own
    ``source`` wins over ``source``: merged runs). TensorRT's time is the fastest of the cuDNN fused graph, the eager
    cuDNN conv + separate epilogue ops and, for depthwise layers, cuDNN's depthwise conv with BatchNorm folded +
    activation: the graph's heuristic plan is sometimes far slower than the plain conv (MobileNetV2's small-C 1x1
    layers, 10-360x on H100), and TensorRT times its tactics, so it would not run that plan. A row with an FP8 time
    (e4m3 X) gives an "fp8" row too, against the same FP16 times (TensorRT's FP16 conv is the engine without the FP8
    plugin; its own FP8 convs are not measured)."""
    out = []
    for r in anchor["rows"]:
        if r.get("graph_us") is None or not r.get("ours_us"):
            continue
        tensorrt_us, tensorrt_by = min((r[key], name) for key, name in TENSORRT_STAND_INS if r.get(key) is not None)
        shape = dict(kernel=(r["kernel"], r["kernel"]), stride=(r["stride"], r["stride"]), channels=r["c"],
                     filters=r["k"], groups=r["groups"], spatial=(r["hw"], r["hw"]), batch=r["batch"],
                     residual=r["residual"], tensorrt_us=round(tensorrt_us, 2), tensorrt_by=tensorrt_by,
                     source=r.get("source") or source)
        out.append(dict(shape, precision="fp16", fused_us=round(r["ours_us"], 2)))
        if r.get("fp8_us"):
            out.append(dict(shape, precision="fp8", fused_us=round(r["fp8_us"], 2)))
    return out


def write_measured(measured: dict, path: Path) -> None:
    """Write the measured table module (generated: edit it by re-running --from-anchor, not by hand)."""
    path.write_text('"""Measured FusedConv vs cuDNN fused graph times per arch, the first evidence of tensorrt_choice.'
                    "\nGenerated by ``python -m trt_fusedattn.plugins.conv.tensorrt_choice --from-anchor ROWS.json``"
                    ' from benchmarks/conv.py --json runs."""\n'
                    f"MEASURED = {pprint.pformat(measured, width=116, sort_dicts=True)}\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Update the measured TensorRT-choice table from an anchor run.")
    parser.add_argument("--from-anchor", required=True, metavar="ROWS.json",
                        help="the --json output of benchmarks/conv.py (its arch replaces that arch's rows)")
    parser.add_argument("--source", help="where the numbers come from, as the report cites it "
                                         "(default: the run's environment line)")
    args = parser.parse_args(argv)
    anchor = json.loads(Path(args.from_anchor).read_text())
    arch = table_arch(anchor["arch"])
    rows = measured_rows(anchor, args.source or anchor["environment"])
    if not rows:
        raise SystemExit(f"{args.from_anchor} has no row with both times (did the cuDNN graphs build?); "
                         "table left as it was")
    measured = dict(MEASURED, **{arch: rows})
    write_measured(measured, Path(__file__).with_name("tensorrt_choice_measured.py"))
    print(f"{arch}: {len(rows)} measured rows, {sum(r['tensorrt_us'] < r['fused_us'] for r in rows)} left to "
          "TensorRT")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
