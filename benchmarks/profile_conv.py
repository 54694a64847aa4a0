"""One ResNet-50 layer of benchmarks/conv.py for Nsight Compute: an FP8 variant of its FP8 table (e4m3 X), our FP16
default, or the cuDNN fused FP16 graph, called --calls times between cudaProfilerStart/Stop after warm-up calls, so
``ncu --profile-from-start off`` sees only those.

    ncu --profile-from-start off --section SpeedOfLight ... \
        python benchmarks/profile_conv.py --layer '3x3 512>512 @7' --batch 32 --run 'x8 default' [--run graph]
"""
from __future__ import annotations

import argparse

import torch

from conv import FP8_SCALE_X, FP8_VARIANTS, Case, fp8_operands, layer_plan, resnet50
from trt_fusedattn.launcher.launch import device_arch, launch


def call_for(case: Case, run: str, arch: str, stream: torch.cuda.Stream):
    """The zero-argument closure of one run on ``case``: "graph" (the cuDNN fused FP16 graph), "fp16" (our FP16
    default) or an FP8 variant label of benchmarks/conv.py (FP8_VARIANTS)."""
    if run == "graph":
        graph = case.anchor(stream)
        return graph.run
    variants = dict(FP8_VARIANTS)
    if run != "fp16" and run not in variants:
        raise SystemExit(f"--run {run!r}: give graph, fp16 or an FP8 variant of benchmarks/conv.py "
                         f"({', '.join(variants)})")
    kw = variants.get(run, {})
    plan = layer_plan(case.layer, case.n, arch, *((FP8_SCALE_X,) if run != "fp16" else ()), **kw)
    ptrs = [case.x.data_ptr(), case.w_folded.data_ptr(), case.shift.data_ptr(), None,
            None if case.residual is None else case.residual.data_ptr()]
    if run != "fp16":
        x8, ptrs = fp8_operands(case, FP8_SCALE_X)
        ptrs = [x8.data_ptr(), *ptrs[1:]] if kw.get("x_e4m3") else ptrs
    return lambda: launch(plan, arch, ptrs, [case.out.data_ptr()], stream=stream.cuda_stream)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layer", required=True, help="a ResNet-50 layer name of benchmarks/conv.py, e.g. '3x3 64>64 @56'")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--run", action="append", required=True,
                        help="graph, fp16 or an FP8 variant label (repeat: profiled in order)")
    parser.add_argument("--calls", type=int, default=1, help="profiled calls of each run")
    args = parser.parse_args()
    layers = {lay.name: lay for lay, _ in resnet50()}
    if args.layer not in layers:
        raise SystemExit(f"--layer {args.layer!r}: give one of {', '.join(layers)}")
    arch, stream = device_arch(0), torch.cuda.Stream()
    case = Case(layers[args.layer], args.batch)
    calls = [call_for(case, run, arch, stream) for run in args.run]
    with torch.cuda.stream(stream):
        for call in calls:  # compile, load and warm up every run before the profiled range
            for _ in range(3):
                call()
        stream.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for call in calls:
            for _ in range(args.calls):
                call()
        stream.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
