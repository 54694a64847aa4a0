"""FusedAttention decode (issue 10 item 2) beside torch SDPA's cuDNN and flash backends, one run, one GPU: 1-16
queries x 1k-128k keys, GQA 32/8, head dim 128 (or --head-dim 64), bfloat16; ours' K/V read bandwidth against the device
read measured in the same run, and the plan's decode tuning variants (cluster splits, wgmma key groups and K/V stages,
the previous rule's choice) as columns beside the plan's choice. Several queries attend bottom-right causally (torch gets the same
as a boolean mask). Timing as benchmarks/attention.py (CUDA-graph replays, median).

    python benchmarks/attention_decode.py --out benchmarks/results/attention_h100_decode_v4.md
    python benchmarks/attention_decode.py --head-dim 64 --quick   # 4k and 32k keys only
"""
from __future__ import annotations

import argparse
from unittest import mock

import torch

from attention import ceilings, ours, read_bandwidth, rel_err, time_ms, torch_backends, versions, write_report
from trt_fusedattn.launcher import device_arch, precompile
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention import plan_decode
from trt_fusedattn.plugins.attention.plan import plan_attention

# (queries, keys, batch)
DECODE = tuple((lq, lkv, b) for lq in (1, 4, 16)
               for lkv, batches in ((1024, (1, 32, 128)), (4096, (1, 8, 32)), (32768, (1, 4, 16)), (131072, (1, 4)))
               for b in batches)
# (MIN_BLOCKS_PER_SM too: a tuning would otherwise get the prefill tiles' register cap, two blocks at head dim 64)
DECODE_TUNING = ("WGMMA", "BLOCK_M", "BLOCK_N", "NUM_WARPS", "Q_IN_REGISTERS", "KV_STAGES", "PACK_GQA", "KV_SPLIT",
                 "WARP_SPLIT", "MIN_BLOCKS_PER_SM")
L2_BYTES = 50 * 2 ** 20  # H100's L2: K/V smaller than this stay in it across the graph's back-to-back calls
# 64 packed rows on the wgmma mainloop (attention_decode_sm90.cuh): key groups of one warpgroup, K/V tile of each,
# K/V stages of each (3: a ring with two tiles in flight while one is computed)
WGMMA_GROUPS = ((1, 64, 2), (1, 128, 2), (2, 64, 2), (3, 64, 2), (1, 64, 3), (1, 128, 3), (2, 64, 3))
# the plan's own tile with a third K/V stage a key group
STAGES3 = "plan's tile, 3 K/V stages"
# the plan's choice by the rule before v5 (session 4's v4.2: no 3-stage split tiles, head dim 64 on mma.sync)
PREVIOUS_RULE = "previous rule (v4.2)"


def _wgmma_name(groups: int, block_n: int, stages: int) -> str:
    return f"wgmma {groups} key groups x{block_n}" + (f", {stages} stages" if stages != 2 else "")


DECODE_VARIANTS = (["split 1", "split 2", "split 4", "split 8"] + [_wgmma_name(*g) for g in WGMMA_GROUPS]
                   + [STAGES3, PREVIOUS_RULE])


def decode_variants(plan, previous) -> dict:
    """Tunings to time beside the plan's decode choice: each cluster split, wgmma key groups of one 64-row warpgroup
    (each at the plan's split), the plan's tile with three K/V stages, and ``previous`` (the previous rule's plan)."""
    base = {k: plan.defines[k] for k in DECODE_TUNING}
    variants = {f"split {s}": {**base, "KV_SPLIT": s} for s in (1, 2, 4, 8) if s != base["KV_SPLIT"]}
    for w, block_n, stages in WGMMA_GROUPS:  # (1-4 queries: a 64-row warpgroup with 4-16 packed rows)
        tuning = {**base, "WGMMA": 1, "BLOCK_M": 64, "NUM_WARPS": 4 * w, "WARP_SPLIT": w, "BLOCK_N": block_n,
                  "KV_STAGES": stages}
        if tuning != base:
            variants[_wgmma_name(w, block_n, stages)] = tuning
    if base["KV_STAGES"] != 3:
        variants[STAGES3] = {**base, "KV_STAGES": 3}
    old = {k: previous.defines[k] for k in DECODE_TUNING}
    if old != base:
        variants[PREVIOUS_RULE] = old
    return variants


def _previous_rule_plan(*args):
    """plan_attention(*args) as the decode rule before v5 chose (its wgmma split tiles off, head dim 128 only)."""
    with mock.patch.object(plan_decode, "wgmma_split_tile", lambda *a: None), \
         mock.patch.object(plan_decode, "WGMMA_DECODE_HEAD_DIMS", (128,)):
        return plan_attention(*args)


def decode_plans(dtype, lq: int, lkv: int, batch: int, dim: int, arch: str) -> tuple:
    """The plan's choice for one decode shape, its variants (name -> tuning) and their plans."""
    causal = int(lq > 1)
    attrs = FUSED_ATTENTION.resolve({"causal": causal, "causal_alignment": "bottom_right" if causal else "top_left"})
    shapes = [(batch, lq, 32, dim), (batch, lkv, 8, dim), (batch, lkv, 8, dim), None, None]
    dtypes = [str(dtype).removeprefix("torch.")] * 3 + [None, None]
    plan = plan_attention(shapes, dtypes, attrs, arch)
    previous = _previous_rule_plan(shapes, dtypes, attrs, arch)
    variants, plans = {}, []
    for name, tuning in (decode_variants(plan, previous) if plan.defines["PACK_GQA"] > 1 else {}).items():
        try:
            plans.append(plan_attention(shapes, dtypes, attrs, arch, tuning=tuning))
            variants[name] = tuning
        except ValueError:  # (a tile whose stages do not fit in shared memory: left out)
            pass
    return plan, variants, plans


def kv_bytes(lkv: int, batch: int, dim: int, dtype) -> int:
    """Bytes of K and V of a decode shape (8 K/V heads)."""
    return 2 * batch * 8 * lkv * dim * torch.empty(0, dtype=dtype).element_size()


def decode(dtype, dim: int = 128, shapes=DECODE) -> tuple[list, list, list]:
    """The decode grid: ours (the plan's choice) beside cuDNN and the best torch backend, with ours' K/V read bandwidth
    against the measured device read bandwidth, and the variants."""
    arch = device_arch(0)
    read = read_bandwidth()
    precompile([p for lq, lkv, b in shapes for plan, _, plans in [decode_plans(dtype, lq, lkv, b, dim, arch)]
                for p in [plan, *plans]], arch)  # in parallel
    names = DECODE_VARIANTS
    header = ["queries", "keys", "batch", "K/V MB", "plan (rows x keys tile, warps, key groups, pack, split, wgmma)",
              "ours ms", "ours K/V TB/s", "% of read", "cuDNN ms", "flash (FA2) ms", "best torch", "ours/best",
              "ours/cuDNN", "err vs torch"] + [f"{n} ms" for n in names]
    rows, gen = [], torch.Generator(device="cuda").manual_seed(0)
    for lq, lkv, b in shapes:
        q = torch.randn(b, lq, 32, dim, device="cuda", dtype=dtype, generator=gen)
        k, v = (torch.randn(b, lkv, 8, dim, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
        causal = lq > 1
        out = torch.full_like(q, float("nan"))
        alignment = "bottom_right" if causal else "top_left"
        plan, variants, _ = decode_plans(dtype, lq, lkv, b, dim, arch)
        t_ours = time_ms(ours(q, k, v, out, causal, alignment=alignment))
        mask = torch.ones(lq, lkv, device="cuda", dtype=torch.bool).tril(lkv - lq) if causal else None
        times, ref = torch_backends(q, k, v, False, mask)
        best_name = min((n for n in times if times[n] == times[n]), key=times.get, default="cuDNN")
        kv = kv_bytes(lkv, b, dim, dtype)
        d = plan.defines
        row = [lq, lkv, b, f"{kv / 2 ** 20:.0f}" + (" (L2)" if kv < L2_BYTES else ""),
               f"{d['BLOCK_M']}x{d['BLOCK_N']}, {d['NUM_WARPS']}, {d['WARP_SPLIT']}, {d['PACK_GQA']}, {d['KV_SPLIT']}, "
               f"{d['WGMMA']}", f"{t_ours:.4f}",
               f"{kv / t_ours / 1e9:.2f}", f"{kv / t_ours / 1e9 / read:.0%}", f"{times['cuDNN']:.4f}",
               f"{times['flash (FA2)']:.4f}", best_name, f"{times[best_name] / t_ours:.2f}",
               f"{times['cuDNN'] / t_ours:.2f}", f"{rel_err(out, ref) if ref is not None else float('nan'):.1e}"]
        for n in names:
            row.append(f"{time_ms(ours(q, k, v, out, causal, variants[n], alignment=alignment)):.4f}"
                       if n in variants else "")
        rows.append(row)
        print(" | ".join(map(str, row)), flush=True)
        del q, k, v, out
    big = [r for r in rows if "(L2)" not in r[3]]
    # % of the read from the unrounded times (the table's column is rounded: 79.9% printed as 80%)
    share = [kv_bytes(r[1], r[2], dim, dtype) / float(r[5]) / 1e9 / read * 100 for r in big]
    share4k = [x for x, r in zip(share, big) if r[1] >= 4096]
    wins = [float(r[11]) for r in rows]
    cudnn = max(kv_bytes(r[1], r[2], dim, dtype) / float(r[8]) / 1e9 for r in big)
    summary = [f"device read bandwidth {read:.2f} TB/s (sum of 1 GiB float32, same run); cuDNN's fastest K/V read in "
               f"this table {cudnn:.2f} TB/s",
               f"K/V larger than L2: ours reads K/V at {min(share):.1f}-{max(share):.1f}% of it ({len(big)} shapes); "
               f"from 4k keys up {sum(x >= 80 for x in share4k)} of {len(share4k)} shapes at >= 80%",
               f"ours >= 1.00x the best torch backend on {sum(x >= 1.0 for x in wins)} of {len(wins)} shapes "
               f"(ours/best {min(wins):.2f}-{max(wins):.2f}x)"]
    return header, rows, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="markdown file for the table")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim of Q, K and V (default 128)")
    parser.add_argument("--quick", action="store_true", help="only the 4k and 32k key shapes")
    args = parser.parse_args()
    shapes = tuple(s for s in DECODE if s[1] in (4096, 32768)) if args.quick else DECODE
    header, rows, summary = decode(torch.bfloat16, args.head_dim, shapes)
    intro = (f"Decode, GQA 32 query / 8 K/V heads, head dim {args.head_dim}, bfloat16, BSHD; several queries attend "
             "bottom-right "
             "causally (torch gets the same as a boolean mask); CUDA-graph replays, median; K/V TB/s = K and V bytes / "
             "time; (L2): K/V fit in the 50 MB L2, so back-to-back calls read them from there.")
    head = f"# FusedAttention decode\n\n{versions()}\n\n{ceilings()}\n\n{intro}\n\n"
    print(write_report(head, header, rows, summary, args.out))


if __name__ == "__main__":
    main()
