"""FusedAttention decode (issue 10 item 2) beside torch SDPA's cuDNN and flash backends, one run, one GPU: 1-16
queries x 1k-128k keys, GQA 32/8, head dim 128 (or --head-dim 64), bfloat16; ours' K/V read bandwidth against the device read measured
in the same run, and the plan's decode tuning variants (cluster splits, key groups of warps, 32 rows a warp, the
wgmma mainloop) as columns beside the plan's choice. Several queries attend bottom-right causally (torch gets the same
as a boolean mask). Timing as benchmarks/attention.py (CUDA-graph replays, median).

    python benchmarks/attention_decode.py --out benchmarks/results/attention_h100_decode_v4.md
    python benchmarks/attention_decode.py --head-dim 64 --quick   # 4k and 32k keys only
"""
from __future__ import annotations

import argparse

import torch

from attention import ceilings, ours, read_bandwidth, rel_err, time_ms, torch_backends, versions, write_report
from trt_fusedattn.launcher import device_arch, precompile
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.plan import plan_attention

# (queries, keys, batch)
DECODE = tuple((lq, lkv, b) for lq in (1, 4, 16)
               for lkv, batches in ((1024, (1, 32, 128)), (4096, (1, 8, 32)), (32768, (1, 4, 16)), (131072, (1, 4)))
               for b in batches)
# (MIN_BLOCKS_PER_SM too: a tuning would otherwise get the prefill tiles' register cap, two blocks at head dim 64)
DECODE_TUNING = ("WGMMA", "BLOCK_M", "BLOCK_N", "NUM_WARPS", "Q_IN_REGISTERS", "KV_STAGES", "PACK_GQA", "KV_SPLIT",
                 "WARP_SPLIT", "MIN_BLOCKS_PER_SM")
L2_BYTES = 50 * 2 ** 20  # H100's L2: K/V smaller than this stay in it across the graph's back-to-back calls
# key groups of warps per block (WARP_SPLIT) timed beside the plan's choice, with the K/V tile each group streams
KEY_GROUPS = ((1, 64), (2, 32), (4, 16), (4, 32), (8, 16))
# 64 packed rows with 32 rows a warp (two warps a key group): half the shared-memory reads of K/V per K/V byte
ROWS32_A_WARP = "4 key groups x32, 32 rows a warp"
# 64 packed rows on the wgmma mainloop (attention_decode_sm90.cuh): key groups of one warpgroup, K/V tile of each,
# K/V stages of each (3: a ring with two tiles in flight while one is computed)
WGMMA_GROUPS = ((1, 64, 2), (1, 128, 2), (2, 64, 2), (3, 64, 2), (1, 64, 3), (1, 128, 3), (2, 64, 3))
# the plan's own tile with a third K/V stage a key group
STAGES3 = "plan's tile, 3 K/V stages"
# <= 16 packed rows (1-4 queries of GQA 32/8) on v4.1's 16-row mma.sync tile: four one-warp key groups of 16 keys
ROWS16_MMA_SYNC = "16 rows, mma.sync 4 key groups x16"
def _wgmma_name(groups: int, block_n: int, stages: int) -> str:
    return f"wgmma {groups} key groups x{block_n}" + (f", {stages} stages" if stages != 2 else "")


DECODE_VARIANTS = (["split 1", "split 2", "split 4", "split 8"] + [f"{w} key groups x{n}" for w, n in KEY_GROUPS]
                   + [ROWS32_A_WARP] + [_wgmma_name(*g) for g in WGMMA_GROUPS] + [ROWS16_MMA_SYNC, STAGES3])


def decode_variants(plan) -> dict:
    """Tunings to time beside the plan's decode choice: each cluster split, each number of key groups of warps (at most
    16 warps a block: 128 registers a thread) on mma.sync, for 64 packed rows warps of 32 rows, and wgmma key groups
    of one 64-row warpgroup (each at the plan's split), and the plan's tile with three K/V stages."""
    base = {k: plan.defines[k] for k in DECODE_TUNING}
    variants = {f"split {s}": {**base, "KV_SPLIT": s} for s in (1, 2, 4, 8) if s != base["KV_SPLIT"]}
    row_warps = base["NUM_WARPS"] // base["WARP_SPLIT"]
    for w, block_n in KEY_GROUPS:
        tuning = {**base, "WGMMA": 0, "NUM_WARPS": row_warps * w, "WARP_SPLIT": w, "BLOCK_N": block_n}
        if tuning != base and row_warps * w <= 16:
            variants[f"{w} key groups x{block_n}"] = tuning
    if base["BLOCK_M"] == 64:
        variants[ROWS32_A_WARP] = {**base, "WGMMA": 0, "NUM_WARPS": 8, "WARP_SPLIT": 4, "BLOCK_N": 32}
    for w, block_n, stages in WGMMA_GROUPS:  # (1-4 queries: a 64-row warpgroup with 4-16 packed rows)
        tuning = {**base, "WGMMA": 1, "BLOCK_M": 64, "NUM_WARPS": 4 * w, "WARP_SPLIT": w, "BLOCK_N": block_n,
                  "KV_STAGES": stages}
        if tuning != base:
            variants[_wgmma_name(w, block_n, stages)] = tuning
    rows = plan.scalars[3] * base["PACK_GQA"]  # (scalars: batch, heads_q, heads_kv, len_q, ...)
    tuning = {**base, "WGMMA": 0, "BLOCK_M": 16, "NUM_WARPS": 4, "WARP_SPLIT": 4, "BLOCK_N": 16}
    if rows <= 16 and tuning != base:
        variants[ROWS16_MMA_SYNC] = tuning
    if base["KV_STAGES"] != 3:
        variants[STAGES3] = {**base, "KV_STAGES": 3}
    return variants


def _decode_plans(dtype, lq: int, lkv: int, batch: int, dim: int, arch: str) -> list:
    """The plan's choice for one decode shape, then its variants' plans."""
    causal = int(lq > 1)
    attrs = FUSED_ATTENTION.resolve({"causal": causal, "causal_alignment": "bottom_right" if causal else "top_left"})
    shapes = [(batch, lq, 32, dim), (batch, lkv, 8, dim), (batch, lkv, 8, dim), None, None]
    dtypes = [str(dtype).removeprefix("torch.")] * 3 + [None, None]
    plan = plan_attention(shapes, dtypes, attrs, arch)
    variants = decode_variants(plan) if plan.defines["PACK_GQA"] > 1 else {}
    return [plan] + [plan_attention(shapes, dtypes, attrs, arch, tuning=t) for t in variants.values()]


def kv_bytes(lkv: int, batch: int, dim: int, dtype) -> int:
    """Bytes of K and V of a decode shape (8 K/V heads)."""
    return 2 * batch * 8 * lkv * dim * torch.empty(0, dtype=dtype).element_size()


def decode(dtype, dim: int = 128, shapes=DECODE) -> tuple[list, list, list]:
    """The decode grid: ours (the plan's choice) beside cuDNN and the best torch backend, with ours' K/V read bandwidth
    against the measured device read bandwidth, and the variants."""
    arch = device_arch(0)
    read = read_bandwidth()
    precompile([p for lq, lkv, b in shapes for p in _decode_plans(dtype, lq, lkv, b, dim, arch)], arch)  # in parallel
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
        plan = _decode_plans(dtype, lq, lkv, b, dim, arch)[0]
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
        variants = decode_variants(plan) if d["PACK_GQA"] > 1 else {}
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
