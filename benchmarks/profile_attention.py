"""One FA2-grid point of FusedAttention (or of cuDNN's kernel on the same inputs) for Nsight Compute: warm-up calls,
then ``--calls`` calls between cudaProfilerStart/Stop, so ``ncu --profile-from-start off`` sees only those.

Grid convention of benchmarks/attention.py: batch * seq = 16k tokens, hidden 2048, BSHD, N(0, 1) inputs (FP8: per-tensor
scales amax / 448 and an e4m3 output, as benchmarks/attention_fp8.py times it).

    ncu --profile-from-start off --clock-control none --section SpeedOfLight ... \
        python benchmarks/profile_attention.py --dtype bfloat16 --dim 128 --seq 2048[,8192] [--causal] [--cudnn]
            [--tuning BLOCK_N=176+KV_STAGES=2 [--tuning ...]]
        python benchmarks/profile_attention.py --dim 64 --decode 1,32768,1   # a decode shape of attention_decode.py
"""
from __future__ import annotations

import argparse

import torch
from torch.nn.attention import SDPBackend

from attention import HIDDEN, TOKENS, ours, parse_variants, sdpa
from attention_fp8 import FP8Problem, cudnn_fp8, ours_fp8
from trt_fusedattn.launcher import device_arch


def call_for(args, seq: int, tuning_text: str):
    """The zero-argument closure running the chosen kernel once on fresh inputs of grid point ``seq`` (FP8: the
    grid's data, benchmarks/attention_fp8.py's seed, so its compiled specializations are reused)."""
    batch, heads = TOKENS // seq, HIDDEN // args.dim
    tuning = parse_variants(f"{args.dim}:{tuning_text}")[args.dim][0] if tuning_text else None
    if args.decode:
        return decode_call(args, tuning)
    if args.dtype == "float8_e4m3fn":
        problem = FP8Problem(batch, seq, heads, args.dim, args.causal, seed=seq + args.dim + int(args.causal))
        out = torch.empty_like(problem.fp8[0])
        return (cudnn_fp8(problem, out) if args.cudnn
                else ours_fp8(problem, out, "float8e4m3fn", device_arch(0), tuning))
    dtype = getattr(torch, args.dtype)
    q, k, v = (torch.randn(batch, seq, heads, args.dim, device="cuda", dtype=dtype) for _ in range(3))
    if args.cudnn:
        return sdpa(q, k, v, args.causal, SDPBackend.CUDNN_ATTENTION)
    return ours(q, k, v, torch.empty_like(q), args.causal, tuning)


def decode_call(args, tuning):
    """benchmarks/attention_decode.py's shape (queries, keys, batch): GQA 32/8, several queries bottom-right causal
    (a tuning replaces the decode plan: give its split and key groups too)."""
    lq, lkv, batch = map(int, args.decode.split(","))
    dtype = getattr(torch, args.dtype)
    q = torch.randn(batch, lq, 32, args.dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, lkv, 8, args.dim, device="cuda", dtype=dtype) for _ in range(2))
    if args.cudnn:
        mask = torch.ones(lq, lkv, device="cuda", dtype=torch.bool).tril(lkv - lq) if lq > 1 else None
        return sdpa(q, k, v, False, SDPBackend.CUDNN_ATTENTION, mask=mask)
    return ours(q, k, v, torch.empty_like(q), lq > 1, tuning, alignment="bottom_right" if lq > 1 else "top_left")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float8_e4m3fn"))
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seq", default="2048", help="sequence length, or several comma-separated (profiled in order)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--cudnn", action="store_true", help="cuDNN's kernel (torch SDPA / frontend sdpa_fp8) instead")
    parser.add_argument("--tuning", action="append", default=None,
                        help="plan tuning overrides of ours, e.g. BLOCK_N=176+KV_STAGES=2; repeat it to profile several "
                             "(each after the default, per sequence length)")
    parser.add_argument("--calls", type=int, default=1, help="profiled calls after the warm-up")
    parser.add_argument("--decode", help="a decode shape instead: queries,keys,batch (GQA 32/8; --seq unused)")
    args = parser.parse_args()
    tunings = [""] + args.tuning if args.tuning and not args.cudnn else [""]
    fns = [call_for(args, int(seq), t) for seq in args.seq.split(",") for t in tunings]
    for fn in fns:
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for fn in fns:  # ncu lists the kernels in this order: per length, the default, then each --tuning
        for _ in range(args.calls):
            fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
