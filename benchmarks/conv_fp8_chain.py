"""FP8 chain rows (``benchmarks/conv.py --fp8-chain-only``): a ResNet-50 bottleneck's 1x1 producer (256/512/1024/2048
-> 64/128/256/512, ReLU) and the FP8 3x3 layer it feeds, at one batch, timed three ways on the same tensors:

- separate quantize: the producer writes float16, a QuantizeLinear pass (benchmarks/quantize_e4m3.cu: one
  16-byte-in, 8-byte-out elementwise kernel) writes e4m3, the 3x3 reads e4m3 X (what a Q/DQ deployment runs);
- in-kernel quantize: the producer writes float16, the 3x3 quantizes it while staging (a calibrated model's FP8
  node without a chain);
- chain: the producer writes e4m3 itself (``output_scale``), the 3x3 reads it (rewrites/conv/fp8_chain.py).

Both layers FP8 (BN-folded W in e4m3 per output channel, the producer's X float16 quantized in its kernel), the
plan's default tiles; our FP16 pair beside them. err: the chain's 3x3 output against the separate-quantize one,
normwise (the producer's float16 rounding before e4m3: one e4m3 step on a few elements)."""
from __future__ import annotations

from pathlib import Path

import torch

from conv import Case, Layer, layer_plan, time_us
from trt_fusedattn.launcher.compile import compile_ptx
from trt_fusedattn.launcher.launch import launch
from trt_fusedattn.launcher.plan import LaunchPlan
from trt_fusedattn.plugins.conv.plan import arch_number, float_literal

QUANTIZE = Path(__file__).resolve().parent / "quantize_e4m3.cu"
WIDTHS = ((64, 56), (128, 28), (256, 14), (512, 7))  # bottleneck width, spatial size (the stride-1 blocks)


def quantize_plan(elements: int, scale: float) -> LaunchPlan:
    groups = elements // 8
    return LaunchPlan(QUANTIZE, "quantize_e4m3", {"SCALE_INV": float_literal(1 / scale)}, ((groups + 255) // 256, 1, 1),
                      (256, 1, 1), 0, (groups,))


def _fp8_weights(case: Case):
    scale = (case.w_folded.float().abs().amax(dim=(1, 2, 3)) / 448).contiguous()
    return (case.w_folded.float() / scale[:, None, None, None]).to(torch.float8_e4m3fn), scale


def _e4m3_like(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(t, dtype=torch.uint8).view(torch.float8_e4m3fn)  # channels-last kept


def chain_table(batches: list, arch: str) -> list[str]:
    if arch_number(arch) < 89:
        return [f"\nFP8 chains need sm_89+ (e4m3); this GPU is {arch}: no table."]
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    scale_x = 4.5 / 448  # the producer's float16 randn input
    lines = ["\n## FP8 chain: producer 1x1 -> FP8 3x3, per pair (µs per call, CUDA-graph medians)\n",
             " ".join(__doc__.split("\n\n", 1)[1].split()) + "\n",
             "| pair | batch | 1x1 fp16-out | 1x1 e4m3-out | quantize | 3x3 fp16-X | 3x3 e4m3-X | separate quantize "
             "| in-kernel quantize | chain | chain vs separate | chain vs in-kernel | our FP16 pair | err |",
             "|---|---:|" + "---:|" * 12]
    for width, hw in WIDTHS:
        producer = Layer("ResNet-50", 4 * width, width, hw, 1)
        consumer = Layer("ResNet-50", width, width, hw, 3)
        for n in batches:
            p, c = Case(producer, n), Case(consumer, n)
            pw8, pws = _fp8_weights(p)
            cw8, cws = _fp8_weights(c)
            p16_plan = layer_plan(producer, n, arch, scale_x)
            run_p16 = lambda: launch(p16_plan, arch, [p.x.data_ptr(), pw8.data_ptr(), p.shift.data_ptr(),  # noqa
                                                      pws.data_ptr(), None], [p.out.data_ptr()], stream=stream())
            run_p16()
            scale_y = float(p.out.float().abs().max()) / 448
            plans = dict(p8=layer_plan(producer, n, arch, scale_x, output_scale=scale_y),
                         c16=layer_plan(consumer, n, arch, scale_y), c8=layer_plan(consumer, n, arch, scale_y,
                                                                                    x_e4m3=True),
                         q=quantize_plan(p.out.numel(), scale_y))
            for plan in plans.values():
                compile_ptx(plan.source, arch, plan.defines)
            y8, y8q = _e4m3_like(p.out), _e4m3_like(p.out)
            out_chain, out_sep = torch.empty_like(c.out), torch.empty_like(c.out)
            c_args = lambda x: [x.data_ptr(), cw8.data_ptr(), c.shift.data_ptr(), cws.data_ptr(), None]  # noqa
            run = dict(
                p8=lambda: launch(plans["p8"], arch, [p.x.data_ptr(), pw8.data_ptr(), p.shift.data_ptr(),
                                                      pws.data_ptr(), None], [y8.data_ptr()], stream=stream()),
                q=lambda: launch(plans["q"], arch, [p.out.data_ptr()], [y8q.data_ptr()], stream=stream()),
                c16=lambda: launch(plans["c16"], arch, c_args(p.out), [c.out.data_ptr()], stream=stream()),
                c8=lambda: launch(plans["c8"], arch, c_args(y8), [out_chain.data_ptr()], stream=stream()),
                c8q=lambda: launch(plans["c8"], arch, c_args(y8q), [out_sep.data_ptr()], stream=stream()))
            for name in ("q", "c16", "p8", "c8", "c8q"):
                run[name]()
            torch.cuda.synchronize()
            err = float((out_chain.float() - out_sep.float()).norm() / out_sep.float().norm())
            t = {name: time_us(fn) for name, fn in [("p16", run_p16), *run.items()] if name != "c8q"}
            fp16_pair = time_us(p.fused) + time_us(c.fused)
            separate, in_kernel, chain = t["p16"] + t["q"] + t["c8"], t["p16"] + t["c16"], t["p8"] + t["c8"]
            lines.append(f"| {producer.name} -> {consumer.name} | {n} | {t['p16']:.1f} | {t['p8']:.1f} | {t['q']:.1f} "
                         f"| {t['c16']:.1f} | {t['c8']:.1f} | {separate:.1f} | {in_kernel:.1f} | {chain:.1f} | "
                         f"{separate / chain:.2f}x | {in_kernel / chain:.2f}x | {fp16_pair:.1f} | {err:.1e} |")
            print(lines[-1], flush=True)
            del p, c
    return lines
