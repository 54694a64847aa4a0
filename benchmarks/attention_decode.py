"""FusedAttention decode (issue 10 item 2) beside torch SDPA's cuDNN and flash backends, one run, one GPU: 1-16
queries x 1k-128k keys, GQA 32/8, head dim 128 (or --head-dim 64), bfloat16; ours' K/V read bandwidth against the device
read measured in the same run and against a plain read (torch sum) of the same bytes, the previous rule's choice as a column beside the plan's choice, and with --candidates
the candidate decode tiles (grid size after the split, wgmma key groups, K/V tile, K/V stages) on grids that split.
Several queries attend bottom-right causally (torch gets the same as a boolean mask). Timing as
benchmarks/attention.py (CUDA-graph replays, median).

    python benchmarks/attention_decode.py --out benchmarks/results/attention_h100_decode_v6.md
    python benchmarks/attention_decode.py --head-dim 64 --quick   # 4k and 32k keys only
    python benchmarks/attention_decode.py --keys 4096,32768,131072 --candidates   # (or --candidates h200)
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
from trt_fusedattn.plugins.attention.plan_decode import SPLIT_TARGET_CTAS

# (queries, keys, batch)
DECODE = tuple((lq, lkv, b) for lq in (1, 4, 16)
               for lkv, batches in ((1024, (1, 32, 128)), (4096, (1, 8, 32)), (32768, (1, 4, 16)), (131072, (1, 4)))
               for b in batches)
# (MIN_BLOCKS_PER_SM too: a tuning would otherwise get the prefill tiles' register cap, two blocks at head dim 64)
DECODE_TUNING = ("WGMMA", "BLOCK_M", "BLOCK_N", "NUM_WARPS", "Q_IN_REGISTERS", "KV_STAGES", "PACK_GQA", "KV_SPLIT",
                 "WARP_SPLIT", "MIN_BLOCKS_PER_SM")
L2_BYTES = 50 * 2 ** 20  # H100's L2: K/V smaller than this stay in it across the graph's back-to-back calls
# Candidate tiles timed beside the plan on grids that split (session 7, --candidates): 64 packed rows on the wgmma
# mainloop as (CTAs after the split, key groups of one warpgroup, keys a K/V tile, K/V stages a group), the split
# being that CTA count over the grid's CTAs without one (only where it is one of the plan's splits). 64 CTAs are one
# an SM (clusters of 8 fit 120 CTAs a wave, 2-CTA clusters 128+), 128 one or two an SM, 256 two an SM.
# Session 8: 256 CTAs of one group x64 with five stages (91,120 B at head dim 64: two an SM at most, where v6's three
# stages fit three an SM and 256 CTAs on 132 SMs leave some SMs with three: ncu of 1 x 32k x 4, busiest SM 1.16x the
# average).
WGMMA_CANDIDATES = ((64, 2, 64, 3), (64, 3, 64, 2), (64, 2, 128, 3), (64, 4, 64, 3), (64, 3, 128, 2),
                    (128, 1, 64, 3), (128, 1, 128, 3), (128, 2, 64, 3), (128, 2, 128, 3), (256, 1, 64, 3),
                    (256, 1, 64, 5))
# <= 16 packed rows: the 16-row mma.sync tile of four one-warp key groups on 32-key tiles with three stages, at the
# plan's split (session 5 run 1: 1 x 32k x 1 at head dim 64 in 0.0289 ms = cuDNN, the plan's wgmma tile 0.0341)
MMA16_CANDIDATE = "mma.sync 16 rows, 4 groups x32, 3 stages"
MMA16_TUNING = {"WGMMA": 0, "BLOCK_M": 16, "NUM_WARPS": 4, "WARP_SPLIT": 4, "BLOCK_N": 32, "KV_STAGES": 3}
# v4.2's tile for <= 16 packed rows on grids of >= 32 CTAs: four one-warp groups of 16-key tiles x two stages, at the
# plan's split
MMA16_V42_CANDIDATE = "mma.sync 16 rows, 4 groups x16, 2 stages (v4.2)"
MMA16_V42_TUNING = {**MMA16_TUNING, "BLOCK_N": 16, "KV_STAGES": 2}
# the same tile with a deeper ring (KV_STAGES 5: four 32-key tile pairs in flight a one-warp group; session 8 run 1:
# v7's head-dim-64 tile at 4k keys x batch 8, no gain at 32k x 1 on the H100; six stages timed the same as five, the
# wgmma tiles with six stages and Q in registers lost)
MMA16_RING_CANDIDATE = "mma.sync 16 rows, 4 groups x32, 5 stages"
MMA16_ALL = {MMA16_CANDIDATE: MMA16_TUNING, MMA16_V42_CANDIDATE: MMA16_V42_TUNING,
             MMA16_RING_CANDIDATE: {**MMA16_TUNING, "KV_STAGES": 5}}
# the plan's choice by the rule before this session's (v6: v7's tiles off)
PREVIOUS_RULE = "previous rule (v6)"


def _candidate_name(ctas: int, groups: int, block_n: int, stages: int) -> str:
    return f"{ctas} CTAs: {groups} groups x{block_n}, {stages} stages"


CANDIDATE_COLUMNS = [_candidate_name(*c) for c in WGMMA_CANDIDATES] + list(MMA16_ALL)
# --candidates h200: the columns whose H200 times decide the next head-dim-128 rule there (NOTES.md, decode session 7):
# three groups x two stages on 64 CTAs (the H200's best at 16 x 32k/128k x 1 under v4.2) and v4.2's 16-row tile (the
# H200's 1 x 32k x 4 at 0.86x cuDNN under v4.2, 0.79x under v5)
# and (session 8) the 16-row tile's five-stage ring where the plan has another tile (the H200 needs more bytes in
# flight than the H100 for the same fraction of its read)
H200_COLUMNS = [_candidate_name(64, 3, 64, 2), MMA16_V42_CANDIDATE, MMA16_RING_CANDIDATE]
# --candidates grid (session 8): head dim 64's batch-4 grids (v6: 256 CTAs of one group x64 x3, 0.88-0.91x a plain
# read of the same bytes at 32k/128k keys) on two an SM, on 128 CTAs, on 64 of three groups
GRID_COLUMNS = [_candidate_name(256, 1, 64, 5), _candidate_name(128, 1, 128, 3), _candidate_name(64, 3, 128, 2)]


def decode_variants(plan, previous, candidates, rows: int, kv_heads_batch: int) -> dict:
    """Tunings to time beside the plan's decode choice: ``previous`` (the previous rule's plan) where it differs, and
    the ``candidates`` columns (names) of the candidate tiles for <= 64 packed ``rows`` on grids that split (fewer than
    SPLIT_TARGET_CTAS CTAs before any split
    (``kv_heads_batch`` CTAs: one 64-row tile per K/V head and batch)."""
    base = {k: plan.defines[k] for k in DECODE_TUNING}
    variants = {}
    old = {k: previous.defines[k] for k in DECODE_TUNING}
    if old != base:
        variants[PREVIOUS_RULE] = old
    grid_ctas = kv_heads_batch
    if not candidates or grid_ctas >= SPLIT_TARGET_CTAS or rows > 64:
        return variants
    for ctas, groups, block_n, stages in WGMMA_CANDIDATES:
        split = ctas // grid_ctas
        tuning = {**base, "WGMMA": 1, "BLOCK_M": 64, "NUM_WARPS": 4 * groups, "WARP_SPLIT": groups, "BLOCK_N": block_n,
                  "KV_STAGES": stages, "KV_SPLIT": split, "Q_IN_REGISTERS": 0}
        name = _candidate_name(ctas, groups, block_n, stages)
        if name in candidates and split in plan_decode.SPLITS and split * grid_ctas == ctas and tuning != base:
            variants[name] = tuning
    for name, mma16 in MMA16_ALL.items():
        if name in candidates and rows <= 16 and {**base, **mma16} != base:
            variants[name] = {**base, **mma16}
    return variants


def _previous_rule_plan(*args):
    """plan_attention(*args) as the v6 decode rule chose (v7's tiles off)."""
    with mock.patch.object(plan_decode, "V7_HEAD_DIMS", ()), mock.patch.object(plan_decode, "V7_MMA16_HEAD_DIMS", ()):
        return plan_attention(*args)


def decode_plans(dtype, lq: int, lkv: int, batch: int, dim: int, arch: str, candidates=()) -> tuple:
    """The plan's choice for one decode shape, its variants (name -> tuning) and their plans."""
    causal = int(lq > 1)
    attrs = FUSED_ATTENTION.resolve({"causal": causal, "causal_alignment": "bottom_right" if causal else "top_left"})
    shapes = [(batch, lq, 32, dim), (batch, lkv, 8, dim), (batch, lkv, 8, dim), None, None]
    dtypes = [str(dtype).removeprefix("torch.")] * 3 + [None, None]
    plan = plan_attention(shapes, dtypes, attrs, arch)
    previous = _previous_rule_plan(shapes, dtypes, attrs, arch)
    variants, plans = {}, []
    chosen = decode_variants(plan, previous, candidates, lq * 4, 8 * batch) if plan.defines["PACK_GQA"] > 1 else {}
    for name, tuning in chosen.items():
        try:
            plans.append(plan_attention(shapes, dtypes, attrs, arch, tuning=tuning))
            variants[name] = tuning
        except ValueError:  # (a tile whose stages do not fit in shared memory: left out)
            pass
    return plan, variants, plans


def kv_bytes(lkv: int, batch: int, dim: int, dtype) -> int:
    """Bytes of K and V of a decode shape (8 K/V heads)."""
    return 2 * batch * 8 * lkv * dim * torch.empty(0, dtype=dtype).element_size()


def decode(dtype, dim: int = 128, shapes=DECODE, candidates=()) -> tuple[list, list, list]:
    """The decode grid: ours (the plan's choice) beside cuDNN and the best torch backend, with ours' K/V read bandwidth
    against the measured device read bandwidth, and the variants (the previous rule and the ``candidates`` columns)
    with the fastest of plan and variants."""
    arch = device_arch(0)
    read = read_bandwidth()
    # a plain read of each shape's K/V bytes (a float32 sum over that many random bytes, same timing): what a streaming
    # kernel of the torch library reaches at that size, launch and ramp included
    read_buffer = torch.randn(max(kv_bytes(lkv, b, dim, dtype) for _, lkv, b in shapes) // 4, device="cuda")
    plans = {s: decode_plans(dtype, *s, dim, arch, candidates) for s in shapes}
    precompile([p for plan, _, more in plans.values() for p in [plan, *more]], arch)  # in parallel
    present = {n for _, variants, _ in plans.values() for n in variants}
    names = [n for n in [PREVIOUS_RULE] + CANDIDATE_COLUMNS if n in present]
    header = ["queries", "keys", "batch", "K/V MB", "plan (rows x keys tile, warps, key groups, K/V stages, pack, split, wgmma)",
              "ours ms", "ours K/V TB/s", "% of read", "cuDNN ms", "flash (FA2) ms", "best torch", "ours/best",
              "ours/cuDNN", "err vs torch", "same-size read ms", "ours / same-size read"] + [f"{n} ms" for n in names]
    header += ["fastest of ours and columns"]
    rows, gen = [], torch.Generator(device="cuda").manual_seed(0)
    for lq, lkv, b in shapes:
        q = torch.randn(b, lq, 32, dim, device="cuda", dtype=dtype, generator=gen)
        k, v = (torch.randn(b, lkv, 8, dim, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
        causal = lq > 1
        out = torch.full_like(q, float("nan"))
        alignment = "bottom_right" if causal else "top_left"
        plan, variants, _ = plans[lq, lkv, b]
        t_ours = time_ms(ours(q, k, v, out, causal, alignment=alignment))
        mask = torch.ones(lq, lkv, device="cuda", dtype=torch.bool).tril(lkv - lq) if causal else None
        times, ref = torch_backends(q, k, v, False, mask)
        best_name = min((n for n in times if times[n] == times[n]), key=times.get, default="cuDNN")
        kv = kv_bytes(lkv, b, dim, dtype)
        d = plan.defines
        row = [lq, lkv, b, f"{kv / 2 ** 20:.0f}" + (" (L2)" if kv < L2_BYTES else ""),
               f"{d['BLOCK_M']}x{d['BLOCK_N']}, {d['NUM_WARPS']}, {d['WARP_SPLIT']}, {d['KV_STAGES']}, {d['PACK_GQA']}, "
               f"{d['KV_SPLIT']}, "
               f"{d['WGMMA']}", f"{t_ours:.4f}",
               f"{kv / t_ours / 1e9:.2f}", f"{kv / t_ours / 1e9 / read:.0%}", f"{times['cuDNN']:.4f}",
               f"{times['flash (FA2)']:.4f}", best_name, f"{times[best_name] / t_ours:.2f}",
               f"{times['cuDNN'] / t_ours:.2f}", f"{rel_err(out, ref) if ref is not None else float('nan'):.1e}"]
        t_read = time_ms(lambda: read_buffer[:kv // 4].sum())
        row += [f"{t_read:.4f}", f"{t_read / t_ours:.2f}"]
        timed = {"plan": t_ours}
        for n in names:
            if n in variants:
                timed[n] = time_ms(ours(q, k, v, out, causal, variants[n], alignment=alignment))
            row.append(f"{timed[n]:.4f}" if n in variants else "")
        fastest = min(timed, key=timed.get)
        row.append(f"{fastest} ({timed[fastest] / t_ours:.2f}x the plan's time)")
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
               f"(ours/best {min(wins):.2f}-{max(wins):.2f}x)",
               "a torch sum over the same bytes (K/V larger than L2) took "
               f"{min(float(r[15]) for r in big):.2f}-{max(float(r[15]) for r in big):.2f}x ours' time"]
    return header, rows, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="markdown file for the table")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim of Q, K and V (default 128)")
    parser.add_argument("--quick", action="store_true", help="only the 4k and 32k key shapes")
    parser.add_argument("--keys", help="only these key lengths, comma-separated (e.g. 4096,32768,131072)")
    parser.add_argument("--candidates", nargs="?", const="all", choices=("all", "h200", "grid"),
                        help="also time the candidate tiles on grids that split: all of them, h200 (H200_COLUMNS) or "
                             "grid (GRID_COLUMNS)")
    args = parser.parse_args()
    keys = {int(k) for k in args.keys.split(",")} if args.keys else {4096, 32768} if args.quick else None
    shapes = tuple(s for s in DECODE if keys is None or s[1] in keys)
    candidates = {"all": CANDIDATE_COLUMNS, "h200": H200_COLUMNS, "grid": GRID_COLUMNS, None: []}[args.candidates]
    header, rows, summary = decode(torch.bfloat16, args.head_dim, shapes, candidates)
    intro = (f"Decode, GQA 32 query / 8 K/V heads, head dim {args.head_dim}, bfloat16, BSHD; several queries attend "
             "bottom-right "
             "causally (torch gets the same as a boolean mask); CUDA-graph replays, median; K/V TB/s = K and V bytes / "
             "time; (L2): K/V fit in the 50 MB L2, so back-to-back calls read them from there.")
    head = f"# FusedAttention decode\n\n{versions()}\n\n{ceilings()}\n\n{intro}\n\n"
    print(write_report(head, header, rows, summary, args.out))


if __name__ == "__main__":
    main()
