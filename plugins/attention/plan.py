"""``plan_attention``: the one launch plan of the FusedAttention kernel (``attention.cu``), shared by the direct
launcher and the TensorRT layer: specialization defines, grid, block, shared memory and int32 scalars.

Dimensions may be TensorRT symbolic expressions, so only ``+ - * //`` touch them; checks that need a value
(head dim, matching batch/heads) run only where the dimension is a plain int.
"""
from __future__ import annotations

import math
from pathlib import Path

from trt_fusedattn.launcher.arch import CLUSTER_ARCH, SM_COUNT, WGMMA_ARCHES, arch_number, shared_limit
from trt_fusedattn.launcher.plan import LaunchPlan
from trt_fusedattn.fp8 import is_e4m3
from trt_fusedattn.plugins.attention.contract import (check_attributes, effective_p_scale, head_dim_problem,
                                                      mask_dtype_name, output_dtype_name)
from trt_fusedattn.plugins.attention.plan_decode import combine_bytes, plan_decode

SOURCE = Path(__file__).with_name("attention.cu")
SOURCE_WARP_SPECIALIZED = Path(__file__).with_name("attention_sm90.cu")
KERNEL = "fused_attention"
ELEMENT_TYPES = ("float16", "bfloat16")
MASK_KINDS = {None: 0, "additive": 1, "bool": 2}
LOG2E = 1.4426950408889634

# Tile per head dim: (BLOCK_M, BLOCK_N, NUM_WARPS, Q_IN_REGISTERS, KV_STAGES), chosen by H100 timings
# (NOTES.md) among those ptxas builds without register spills. Other head dims (and D_qk != D_v) take the tile of
# the smallest key >= both head dims padded to 16; 257-512 take TILE_LARGE (O alone is D_v / 2 registers a
# thread there, so it spills: correct, not fast).
TILES = {16: (128, 128, 4, 1, 2), 32: (128, 64, 4, 0, 2), 64: (128, 64, 4, 1, 2), 96: (128, 64, 8, 0, 2), 128: (128, 64, 4, 0, 2),
         256: (128, 32, 8, 0, 2)}
TILE_LARGE = (64, 16, 4, 0, 2)
# A mask's per-element loads need registers: masked specializations use 16 query rows per warp.
TILES_MASKED = {16: (128, 128, 8, 0, 2), 32: (128, 64, 8, 0, 2), 64: (128, 64, 8, 0, 2), 96: (128, 64, 8, 0, 2), 128: (128, 64, 8, 0, 2),
                256: (128, 32, 8, 0, 2)}
# GPUs with 99 KB of shared memory per block (sm_86, sm_89, sm_120) get smaller head-dim-256 tiles.
TILES_SMALL_SMEM = {**TILES, 256: (64, 16, 4, 0, 2)}
# The Hopper mainloop (attention_mainloop_sm90.cuh: wgmma, one warpgroup per 64 query rows) for these head dims on
# sm_90a: (BLOCK_M, BLOCK_N, NUM_WARPS, Q_IN_REGISTERS, KV_STAGES); masks use the same tiles (16 rows per warp already).
# Head dim 64 runs two blocks per SM (<= 128 registers, 50 KB smem each) so one block's softmax overlaps the other's
# wgmmas (without a mask: an additive mask's loads would spill at 128 registers); head dim 128 one block of 128x128
# (about 160-210 registers). Predictions and timings: NOTES.md.
WGMMA_TILES = {64: (128, 64, 8, 0, 2), 128: (128, 128, 8, 0, 2), 256: (128, 64, 8, 0, 2)}
WGMMA_MIN_BLOCKS_PER_SM = {64: 2, 128: 1, 256: 1}
# Head dim 64 with few static keys (<= WGMMA_SHORT_KEYS; no mask or softcap, no tuning): 64-row tiles at four blocks an
# SM, (tile, blocks an SM). H100 job attn-decode-1 (deployment table, same run): ViT-L 32x197 0.0327 ms vs 0.0339 for
# 128x64 (cuDNN 0.0336), BERT 32x512 with key lengths 0.0664 vs 0.0684, SD cross (77 keys) 0.0108 vs 0.0113; Whisper
# (1500 keys) lost 3%.
WGMMA_SHORT_KEYS_TILES = {64: ((64, 64, 4, 0, 2), 4)}
WGMMA_SHORT_KEYS = 512
# Head dims whose default on sm_90a is a wgmma kernel (they timed faster than the mma.sync path: NOTES.md).
WGMMA_DEFAULT_HEAD_DIMS = (64, 128, 256)
# FA3's intra-warpgroup overlap (P V of tile t+1 during the softmax of tile t; NOTES.md): off until timed.
WGMMA_OVERLAP = {64: 0, 128: 0, 256: 0}
WGMMA_SMEM_ALIGN = 1024  # its swizzled tiles start 1024-byte aligned: the kernel rounds its smem base up
# The wgmma mainloop is the default on sm_90a: it passed the GPU tests and timed faster than the mma.sync path
# (NOTES.md, benchmarks/results/).
WGMMA_BY_DEFAULT = True
# The warp-specialized Hopper kernel (attention_sm90.cu: a load warpgroup + two MMA warpgroups with ping-pong and
# intra-warpgroup overlap, FlashAttention-3's design): its tiles, and its K/V pipeline's mbarriers (full Q, full and
# empty K and V per stage, 8 bytes each) after the tiles.
# It is the default (when the tuning does not force WGMMA) where it passed the GPU tests and timed faster than the wgmma
# mainloop at every point: head dims 128 and 256 without a mask. Head dim 64 timed about the same as the wgmma mainloop
# and masked tiles are untimed: those stay on the wgmma mainloop (measurements: NOTES.md).
# hd64/hd128 keep three K/V stages (115/226 KB): faster than two at hd128 at every seq >= 2k point. hd64 takes three MMA
# warpgroups (192-row tiles, FlashAttention-3's hd64 shape: its softmax is longer than one warpgroup's products, so a
# third warpgroup keeps the tensor pipe fed; H100 run attn-ws-2: +8-24% over two warpgroups non-causal 2k-16k, 1.03-1.12x
# cuDNN from 4k); it is the default where it beat the wgmma mainloop: static lengths, non-causal >= 1500, causal >= 4k
# (causal 2k lost, 326 vs 345 TFLOP/s; non-causal: Whisper 8x1500 0.2268 ms vs 0.2528 on the wgmma mainloop, 1.07x cuDNN,
# H100 run attn-decode-2's deployment table, while BERT's 512 rows lost 28%; 513-1499 untimed). hd256 on 80-key tiles
# (tuning BLOCK_N=80) timed -3..+4%: not taken.
WARP_SPECIALIZED_TILES = {64: (192, 128, 12, 0, 3), 128: (128, 128, 8, 0, 3), 256: (128, 64, 8, 0, 2)}
# Masked or soft-capped specializations: an additive mask's loads at head dim 128 spill (40 B) with 128-key tiles at
# the MMA warpgroups' 240 registers; hd64 keeps two MMA warpgroups (with three, at 160 registers, a mask's loads or the
# softcap's tanh spill 36-196 B)
WARP_SPECIALIZED_TILES_MASKED = {**WARP_SPECIALIZED_TILES, 64: (128, 128, 8, 0, 3), 128: (128, 64, 8, 0, 2)}
WARP_SPECIALIZED_DEFAULT_HEAD_DIMS = (128, 256)
LOAD_WARPGROUP_THREADS = 128
# Copy groups a 16-bit loader thread keeps in flight before publishing the oldest (attention_load_sm90.cuh; 0: each
# group is published once it has landed, which one K/V stage needs).
WARP_SPECIALIZED_LOAD_LAG = 1
# 16-bit MMA warpgroups, per head dim: P V(t+1) under the softmax of S(t) (1: intra-warpgroup overlap and ping-pong),
# or both products one after the other in a turn and P over S's registers (0: ping-pong only).
# attention_mma_warpgroups_sm90.cuh. Head dim 256 takes 0: on its 64-key tiles the serial step timed +10% (H100 job
# prep-ws-next, 2026-11-24, bf16 non-causal 2k-16k 620/643/624/652 TFLOP/s vs 563/556/578/579 with the overlap,
# causal 498/532/570/638 vs 441/457/517/578); 128-key tiles with one K/V stage lost there (480-522).
WARP_SPECIALIZED_PV_OVERLAP = {64: 1, 128: 1, 256: 0}
# Unmasked 16-bit head dims without causal masking: (tile, PV_OVERLAP) instead of the above. Head dim 128: three MMA
# warpgroups on 128-key tiles, two K/V stages (176 KB) and the serial step (P over S's registers: S + P + O fit 160),
# H100 job attn-ws-1 (2026-11-24): bf16 569/590/615/629 TFLOP/s at 2k-16k vs 500/555/578/591 for 128x128 x 3 stages
# with the overlap (fp16 551/577/612/623 vs 488/546/568/564); on 96-key tiles x three stages 550/587/611/626. Causal
# keeps 128x128 with the overlap: three warpgroups timed even there (bf16 423/490/564/577 vs 425/492/534/571) and
# lost on Llama-3 prefill (1x4096 0.2946 ms on 192x96 vs 0.2646, 4x2048 0.3223 vs 0.3106); their causal step spills 8 B.
WARP_SPECIALIZED_NON_CAUSAL = {128: ((192, 128, 12, 0, 2), 0)}
# FP8 (E4M3 Q/K/V): the warp-specialized kernel with e4m3 wgmmas on sm_90a only (an sm_89 mma.sync path is not built
# yet), for these head dims (D_qk == D_v), plus staging tiles of V as copied (attention_load_sm90.cuh: the loader
# transposes V, the FP8 wgmma's B being K-major only). P <= 1 when quantized, so the running max moves whenever it
# grows (threshold 0). Head dim 64 without a mask takes three MMA warpgroups (192-row tiles; H100 run attn-ws-2:
# +21-41% non-causal, +6-19% causal at 2k-16k, 0.85-1.03x cuDNN FP8). FP8 v10 (H100 run attn-fp8-1, 2026-11-24,
# attention_fp8_h100_v10_candidates.md), with the serial step (FP8_PV_OVERLAP 0, S and P never live together):
# hd128 (non-causal; causal: FP8_CAUSAL) on three warpgroups x 128 keys, 738/782/826/863 TFLOP/s non-causal at 2k-16k vs v9's 192x96 overlapped
# 683/735/781/803 (+6-8%), causal 501/600/694/777 vs 499/605/712/759 (even); hd256 on 128x128 tiles (two stages, one
# V staging tile: 230,384 B), 818/860/898/960 vs v9's 128x64 677/754/804/818 (+12-21%), causal 607/724/787/914 vs
# 505/631/708/812 (+11-20%); the serial step on hd256's 64-key tiles gained 0-5%. Masked or soft-capped hd64/hd128
# keep two warpgroups (three spill 60-244 B at hd128), and hd256 64-key tiles (128 keys spill 44-416 B with a mask).
# Timings: NOTES.md.
FP8_TILES = {64: (192, 128, 12, 0, 3), 128: (192, 128, 12, 0, 3), 256: (128, 128, 8, 0, 2)}
FP8_TILES_MASKED = {**FP8_TILES, 64: (128, 128, 8, 0, 3), 128: (128, 128, 8, 0, 3), 256: (128, 64, 8, 0, 2)}
# Tiles of K and V an FP8 loader thread keeps in flight before it publishes the oldest (KV_LOAD_LAG; V takes lag + 1
# staging tiles as copied, before its transpose): 2 at hd64/hd128 (attn-fp8-3: +2-5% at every point of both), 1 at
# hd256 (three stages with lag 2: -3..+1%).
FP8_LOAD_LAG = {64: 2, 128: 2, 256: 1}
# FP8 MMA warpgroups' step per head dim (PV_OVERLAP, as WARP_SPECIALIZED_PV_OVERLAP). attn-fp8-1: hd64's serial step
# timed even (505/540/603/611 vs 481/545/603/608 non-causal, -1..-3% causal), so hd64 keeps the overlap; the serial
# step's other P V order (SERIAL_PV_IN_TURN=0, P V after the softmax) lost 1-3% at hd128 non-causal and up to 9% at
# hd256 x 128 keys (-4/+1/-4/-7% non-causal, 0/-1/+3/-9% causal).
FP8_PV_OVERLAP = {64: 1, 128: 0, 256: 0}
FP8_RESCALE_THRESHOLD = "0.0f"
# Every n-th n8 block of S exponentiated on the FP32 pipe instead of MUFU (attention_softmax.cuh; 0: none): every 4th
# was 3-9% slower at every point on the H100 (FP8 run 3, NOTES.md).
FP8_EXP2_FMA_EVERY = 0
# Units of the FP8 V transpose a loader warp keeps in flight (attention_v_transpose_sm90.cuh): 2, or 4 with the
# loader taking 56 registers from two MMA warpgroups with PV_OVERLAP=0 (a tuning until timed).
FP8_V_TRANSPOSE_BATCH = 2
# Fewer FP8 loader instructions, per head dim: the V transpose's shared addresses stepped from one base a column
# strip (VT_ADDRESS_STEP, attention_v_transpose_sm90.cuh) and K/V tiles wholly inside the keys copied without
# per-copy bounds tests (KV_WHOLE_TILE_COPIES, as WARP_SPECIALIZED_WHOLE_TILE_COPIES for the 16-bit loader). H100 job
# attn-fp8-2 (2026-11-25, attention_fp8_h100_v12b_candidates.md), both at hd256: 8 of 8 points faster, geometric mean
# +5.3% (the rule: >= 6 of 8 and >= 1% beyond the default timed again, -3.3%); hd128 +2.3% (6 of 8) and hd64 -5.2%
# missed it (KV_WHOLE_TILE_COPIES alone: hd128 +1.8%, hd64 +0.9%; VT_ADDRESS_STEP alone: hd64 -2.6%).
FP8_VT_ADDRESS_STEP = {64: 0, 128: 0, 256: 1}
FP8_KV_WHOLE_TILE_COPIES = {64: 0, 128: 0, 256: 1}
# Unmasked causal FP8, per head dim: tuning that replaces the above. Head dim 128 on two MMA warpgroups x 256-key
# tiles (cuDNN's FP8 hd128 shape; serial step, two stages, lag 1) with the loader trims, H100 job attn-fp8-2
# (2026-11-25, attention_fp8_h100_v13_candidates.md): causal 522/651/737/842 TFLOP/s at 2k-16k vs the three-warpgroup
# 128-key default's 500/615/719/781 (timed again last: 511/615/715/721), 4 of 4 points, geometric mean +5.1%; without
# causal masking it timed even (734/763/831/831 vs 719/808/831/852): not taken there.
FP8_CAUSAL = {128: {"BLOCK_M": 128, "BLOCK_N": 256, "NUM_WARPS": 8, "KV_STAGES": 2, "KV_LOAD_LAG": 1,
                    "VT_ADDRESS_STEP": 1, "KV_WHOLE_TILE_COPIES": 1}}


# 16-bit loader (attention_load_sm90.cuh): 1 copies the K/V tiles that lie wholly inside the keys without per-row
# bounds tests (3 instructions a 16-byte copy instead of 6-7), 0 tests every row. H100 job attn-ws-3 of session 9
# (1 vs 0 in one run, TFLOP/s at 4k/8k/16k): bf16 hd128 +3/+1/+3% non-causal, +5/+9/+4% causal; hd256 +4/+3/+7%,
# 0/+1/+5%; fp16 hd128 +6/0/+2%, +3/+3/+4%; hd64 +2-3%; Llama-3 prefill 1x4096 -6% time, 4x2048 -4%.
WARP_SPECIALIZED_WHOLE_TILE_COPIES = 1
# The persistent grid (attention_persistent_scheduler_sm90.cuh; 16-bit warp-specialized kernel): at most this many
# CTAs, each computing work items (a query block, or under causal masking a long and a short one) in a static
# order; 0 (tuning PERSISTENT_CTAS=0) launches one CTA a query tile. Taken by default for plain causal
# self-attention of static length in WARP_SPECIALIZED_PERSISTENT_CAUSAL_LENS with at least one work item a CTA
# (v13c, H100 job attn-ws-1 of session 9, 132 CTAs vs one CTA a tile in one run, TFLOP/s at 2k/4k/8k/16k: bf16 hd128
# causal +17/+3/+3/0%, hd256 +16/+6/+4/-2%, fp16 hd128 +7/+3/+3/-1%; Llama-3 prefill 4x2048 -12% time, 1x4096 -4%;
# non-causal -11..+2%; chunked prefill, Lq < Lkv with 64 items for 132 SMs, 1.8x the time).
WARP_SPECIALIZED_PERSISTENT_CTAS = SM_COUNT
WARP_SPECIALIZED_PERSISTENT_CAUSAL_LENS = (2048, 8192)
# Bounds the rounds of a work-item count in the symbolic min (int32 counts give fewer than 2^24 rounds of >= 132).
_ROUNDS_BOUND = 1 << 24


def warp_specialized_persistent_ctas(causal: int, plain: bool, key_lengths: bool, batch, heads_q, len_q, len_kv,
                                     block_m: int) -> int:
    """PERSISTENT_CTAS of the 16-bit warp-specialized kernel by default: WARP_SPECIALIZED_PERSISTENT_CTAS for plain
    causal self-attention (no mask, softcap or key lengths; Lq = Lkv static, within
    WARP_SPECIALIZED_PERSISTENT_CAUSAL_LENS) whose causal work items (pairs of query blocks) fill that many CTAs,
    else 0 (one CTA a query tile)."""
    low, high = WARP_SPECIALIZED_PERSISTENT_CAUSAL_LENS
    if not (causal and plain and not key_lengths and all(isinstance(d, int) for d in (batch, heads_q, len_q, len_kv))
            and len_q == len_kv and low <= len_q <= high):
        return 0
    items = (-(-len_q // block_m) + 1) // 2 * heads_q * batch
    return WARP_SPECIALIZED_PERSISTENT_CTAS if items >= WARP_SPECIALIZED_PERSISTENT_CTAS else 0


def pipeline_barrier_bytes(stages: int, persistent: bool = False, q_stages: int = 1) -> int:
    """The warp-specialized kernel's mbarriers (attention_pipeline_sm90.cuh: kPipelineBarriers)."""
    return (1 + 4 * stages + (2 * q_stages - 1 if persistent else 0)) * 8


def persistent_grid(items, ctas: int) -> tuple:
    """1-D grid of min(work items, ``ctas``) CTAs, the min written with + - * // only so that a TensorRT symbolic
    item count gets the launcher's grid: (rounds + B) // (B + 1) is 0 below one whole round of ``ctas`` items and 1
    for 1..B + 1 rounds."""
    at_least_one_round = (items // ctas + _ROUNDS_BOUND) // (_ROUNDS_BOUND + 1)
    return (items - (items - ctas) * at_least_one_round, 1, 1)


# The online softmax moves a row's reference max only when a tile exceeds it by more than this (log2 units).
RESCALE_THRESHOLD = "8.0f"


def shared_mem_bytes(head_dim: int, block_m: int, block_n: int, stages: int, wgmma: bool = False,
                     overlap: bool = False, head_dim_v: int | None = None, fp8: bool = False,
                     key_groups: int = 1, load_lag: int = 1) -> int:
    """Q tile + ``stages`` K and V tiles (what attention.cu lays out): for mma.sync rows of the head dim padded to
    16, plus 16 bytes (and at least the output staging, kBlockM rows of V's pitch, which reuses them); unpadded
    (swizzled) for wgmma, plus the slack that aligns them to 1024 bytes, and a third V tile with WGMMA_OVERLAP."""
    if fp8:  # one-byte tiles: Q, K and V^T stages, load_lag + 1 V staging tiles
        return (block_m + (2 * stages + load_lag + 1) * block_n) * head_dim + WGMMA_SMEM_ALIGN - 16
    if wgmma:  # (decode: WARP_SPLIT key groups each have their own K/V stages)
        return ((block_m + key_groups * (2 * stages + int(overlap)) * block_n) * head_dim * 2
                + WGMMA_SMEM_ALIGN - 16)
    pitch_qk, pitch_v = (-(-d // 16) * 16 + 8 for d in (head_dim, head_dim_v or head_dim))
    # (WARP_SPLIT key groups each have their own K/V stages)
    return max(block_m * pitch_qk + key_groups * stages * block_n * (pitch_qk + pitch_v), block_m * pitch_v) * 2


def _float_literal(x: float) -> str:
    """A C++ float literal of ``x`` to 9 significant digits (``30`` -> ``30.0f``: ``30f`` does not parse)."""
    text = f"{x:.9g}"
    return text + ("f" if any(c in text for c in ".en") else ".0f")


def _fp8_defines(attrs: dict) -> dict:
    """The FP8 specialization's scales (attention_config.cuh): P is quantized as e4m3(p / p_scale), exp2's argument
    carrying log2(1 / p_scale); O = v_scale * sum(e4m3(p') V) / sum(p') (p_scale cancels), over output_scale and
    rounded to e4m3 for a float8e4m3fn output."""
    e4m3_out = attrs.get("output_dtype", "auto") not in ("auto", "float16", "bfloat16")
    factor = float(attrs["v_scale"]) / (float(attrs["output_scale"]) if e4m3_out else 1.0)
    return {"FP8": 1, "P_SCALE_LOG2": _float_literal(-math.log2(effective_p_scale(float(attrs.get("p_scale", 0.0))))),
            "OUTPUT_FACTOR": _float_literal(factor), "OUTPUT_E4M3": int(e4m3_out)}


def _bshd(shape, layout: str):
    """(batch, seq, heads, head_dim) of a rank-4 Q/K/V shape in ``layout``."""
    b, x, y, d = shape
    return (b, x, y, d) if layout == "BSHD" else (b, y, x, d)


def _strides(seq: object, heads: object, dim: int, layout: str) -> tuple:
    """(batch, head, seq) element strides of a contiguous tensor in ``layout``."""
    if layout == "BSHD":
        return seq * heads * dim, dim, heads * dim
    return heads * seq * dim, seq * dim, dim


def _check_equal(what: str, a, b) -> None:
    if isinstance(a, int) and isinstance(b, int) and a != b:
        raise ValueError(f"FusedAttention: {what} differ ({a} vs {b}); Q, K, V and the mask must agree")


def _mask_strides(mask_shape, batch, heads_q, len_q, len_kv) -> tuple:
    """(batch, head, query, key) element strides of a contiguous mask broadcast to [B, H_q, L_q, L_kv]."""
    if not 2 <= len(mask_shape) <= 4:
        raise ValueError(f"FusedAttention: mask must have rank 2, 3 or 4 (got shape {tuple(mask_shape)})")
    dims = (1,) * (4 - len(mask_shape)) + tuple(mask_shape)
    for name, d, full in zip(("batch", "heads", "query length", "key length"), dims, (batch, heads_q, len_q, len_kv)):
        if not (isinstance(d, int) and d == 1):
            _check_equal(f"mask {name} and attention {name}", d, full)
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(0 if isinstance(d, int) and d == 1 else step)
        step = step * d
    return tuple(reversed(strides))


def plan_attention(input_shapes, input_dtypes, attrs: dict, arch: str, *, tuning: dict | None = None) -> LaunchPlan:
    """Launch plan of FusedAttention for these inputs (Q, K, V, mask, key_lengths; None when absent).
    ``tuning`` overrides tuning defines (WGMMA, BLOCK_M, BLOCK_N, NUM_WARPS, Q_IN_REGISTERS, KV_STAGES,
    RESCALE_THRESHOLD, MIN_BLOCKS_PER_SM, WGMMA_OVERLAP, WARP_SPECIALIZED, KV_SPLIT, PACK_GQA; the warp-specialized
    kernel's KV_LOAD_LAG, PV_OVERLAP and SERIAL_PV_IN_TURN) of the per-head-dim choice: for tests and benchmarks.
    WGMMA=1 forces the Hopper wgmma mainloop (sm_90a, head dims 64/128), WGMMA=0 the mma.sync one; without it
    ``WGMMA_BY_DEFAULT`` decides. WARP_SPECIALIZED=1 (on top of the wgmma mainloop) takes the warp-specialized kernel
    (attention_sm90.cu); without it (and without WGMMA) ``WARP_SPECIALIZED_DEFAULT_HEAD_DIMS`` decides."""
    q_shape, k_shape, v_shape, mask_shape, lengths_shape = (list(input_shapes) + [None] * 5)[:5]
    q_dtype, k_dtype, v_dtype, mask_dtype, lengths_dtype = (list(input_dtypes) + [None] * 5)[:5]
    layout = attrs.get("layout", "BSHD")
    if layout not in ("BSHD", "BHSD"):
        raise ValueError(f"FusedAttention: layout must be BSHD or BHSD, got {layout!r}")
    fp8 = is_e4m3(q_dtype)
    if q_dtype not in ELEMENT_TYPES and not fp8:
        raise ValueError(f"FusedAttention kernel takes float16 or bfloat16 Q (or float8_e4m3fn with its scales), got "
                         f"{q_dtype}: cast Q, K, V (and a float mask)")
    check_attributes(q_dtype, k_dtype, v_dtype, attrs)
    if k_dtype != q_dtype or v_dtype != q_dtype:
        raise ValueError(f"FusedAttention: K and V must have Q's dtype {q_dtype} (got {k_dtype}, {v_dtype})")
    for name, shape in (("Q", q_shape), ("K", k_shape), ("V", v_shape)):
        if shape is None or len(shape) != 4:
            raise ValueError(f"FusedAttention: {name} must be rank 4 ({layout}), got shape {shape}")
    batch, len_q, heads_q, dim = _bshd(q_shape, layout)
    kb, len_kv, heads_kv, kdim = _bshd(k_shape, layout)
    vb, vlen, vheads, vdim = _bshd(v_shape, layout)
    problem = head_dim_problem(dim, vdim)
    if problem:
        raise ValueError(f"FusedAttention kernel: {problem}")
    for what, a, b in (("Q and K head dims", dim, kdim), ("Q and K batch", batch, kb),
                       ("K and V batch", kb, vb), ("K and V lengths", len_kv, vlen), ("K and V heads", heads_kv, vheads)):
        _check_equal(what, a, b)
    if isinstance(heads_q, int) and isinstance(heads_kv, int) and heads_q % heads_kv:
        raise ValueError(f"FusedAttention: query heads ({heads_q}) must be a multiple of key/value heads ({heads_kv})")
    if fp8 and (arch not in WGMMA_ARCHES or dim not in FP8_TILES or vdim != dim):
        raise ValueError(f"FusedAttention FP8 (float8_e4m3fn Q/K/V) runs on {', '.join(WGMMA_ARCHES)} for head dims "
                         f"{', '.join(map(str, sorted(FP8_TILES)))} (Q/K and V alike), not {arch} head dims {dim}/{vdim}; "
                         f"give float16/bfloat16 Q/K/V there")

    if mask_shape is None:
        mask_kind = None
    elif mask_dtype == "bool":
        mask_kind = "bool"
    elif mask_dtype == mask_dtype_name(q_dtype, attrs):
        mask_kind = "additive"
    else:
        raise ValueError(f"FusedAttention: mask must be bool or {mask_dtype_name(q_dtype, attrs)} (the output's dtype, "
                         f"float16 for an FP8 output), got {mask_dtype}")
    if lengths_shape is not None:
        if lengths_dtype != "int32" or len(lengths_shape) != 1:
            raise ValueError(f"FusedAttention: key_lengths must be int32 [batch], got {lengths_dtype} {lengths_shape}")
        _check_equal("key_lengths and batch", lengths_shape[0], batch)

    for name, d in (("batch", batch), ("query heads", heads_q)):
        if isinstance(d, int) and d > 65535:
            raise ValueError(f"FusedAttention: {name} {d} exceeds the grid limit 65535; split the call")
    small_smem = shared_limit(arch) < 128 * 1024
    table = TILES_MASKED if mask_kind is not None else TILES
    if small_smem:
        table = {**table, 256: TILES_SMALL_SMEM[256]}
    padded = max(-(-dim // 16) * 16, -(-vdim // 16) * 16)
    tile_key = min((d for d in table if d >= padded), default=None)
    wgmma_ok = arch in WGMMA_ARCHES and dim in WGMMA_TILES and vdim == dim
    decode = None if tuning or fp8 else plan_decode(batch, len_q, len_kv, heads_q, heads_kv, dim, vdim, arch)
    wgmma = int((tuning or {}).get("WGMMA", fp8 or WGMMA_BY_DEFAULT and wgmma_ok and (
        decode.wgmma if decode else dim in WGMMA_DEFAULT_HEAD_DIMS or bool((tuning or {}).get("WARP_SPECIALIZED")))))
    if wgmma and not wgmma_ok:
        raise ValueError(f"FusedAttention: the wgmma mainloop runs on {', '.join(WGMMA_ARCHES)} for head dims "
                         f"{sorted(WGMMA_TILES)} (Q/K and V alike), not {arch} head dims {dim}/{vdim}; use WGMMA=0")
    long_rows = (dim == 64 and all(isinstance(d, int) for d in (len_q, len_kv)) and
                 min(len_q, len_kv) >= (4096 if int(attrs.get("causal", 0)) else 1500))
    ws = int((tuning or {}).get("WARP_SPECIALIZED", fp8 or wgmma and "WGMMA" not in (tuning or {}) and mask_kind is None
                                and not decode and (dim in WARP_SPECIALIZED_DEFAULT_HEAD_DIMS or long_rows)))
    if ws and not wgmma:
        raise ValueError("FusedAttention: the warp-specialized kernel is built on the wgmma mainloop; WARP_SPECIALIZED=1 "
                         f"needs WGMMA=1 ({', '.join(WGMMA_ARCHES)}, head dims {sorted(WGMMA_TILES)})")
    if fp8 and not ws:
        raise ValueError("FusedAttention FP8 runs on the warp-specialized kernel only (WGMMA=1, WARP_SPECIALIZED=1)")
    plain = mask_kind is None and not float(attrs.get("softcap", 0.0))  # (a negative softcap is refused below)
    ws_table = ((FP8_TILES if plain else FP8_TILES_MASKED) if fp8
                else WARP_SPECIALIZED_TILES if plain else WARP_SPECIALIZED_TILES_MASKED)
    short_keys = (wgmma and not ws and not decode and not tuning and plain and dim in WGMMA_SHORT_KEYS_TILES
                  and isinstance(len_kv, int) and len_kv <= WGMMA_SHORT_KEYS)
    non_causal = (ws and not fp8 and plain and not int(attrs.get("causal", 0))
                  and WARP_SPECIALIZED_NON_CAUSAL.get(dim))
    block_m, block_n, warps, q_in_registers, stages = (non_causal[0] if non_causal else ws_table[dim] if ws
                                                       else decode.tile if decode
                                                       else WGMMA_SHORT_KEYS_TILES[dim][0] if short_keys
                                                       else WGMMA_TILES[dim] if wgmma
                                                       else table[tile_key] if tile_key else TILE_LARGE)
    tune = {"WARP_SPECIALIZED": ws, "WGMMA": wgmma, "BLOCK_M": block_m, "BLOCK_N": block_n, "NUM_WARPS": warps, "Q_IN_REGISTERS": q_in_registers,
            "KV_STAGES": stages, "RESCALE_THRESHOLD": FP8_RESCALE_THRESHOLD if fp8 else RESCALE_THRESHOLD,
            "MIN_BLOCKS_PER_SM": WGMMA_SHORT_KEYS_TILES[dim][1] if short_keys
            else WGMMA_MIN_BLOCKS_PER_SM[dim] if wgmma and not ws and not decode and mask_kind is None else 1,
            "WGMMA_OVERLAP": WGMMA_OVERLAP[dim] if wgmma and not ws else 0, "KV_SPLIT": decode.split if decode else 1,
            "PACK_GQA": decode.pack if decode else 1, "WARP_SPLIT": decode.warp_split if decode else 1}
    if ws:
        tune["KV_LOAD_LAG"] = FP8_LOAD_LAG[dim] if fp8 else WARP_SPECIALIZED_LOAD_LAG
        tune["PV_OVERLAP"] = (FP8_PV_OVERLAP[dim] if fp8 else non_causal[1] if non_causal
                              else WARP_SPECIALIZED_PV_OVERLAP[dim])
        tune["SERIAL_PV_IN_TURN"] = 1
        if not fp8:
            tune["KV_WHOLE_TILE_COPIES"] = WARP_SPECIALIZED_WHOLE_TILE_COPIES
            tune["PERSISTENT_CTAS"] = warp_specialized_persistent_ctas(
                int(attrs.get("causal", 0)), plain, lengths_shape is not None, batch, heads_q, len_q, len_kv, block_m)
    if fp8:
        tune["EXP2_FMA_EVERY"] = FP8_EXP2_FMA_EVERY
        tune["V_TRANSPOSE_BATCH"] = FP8_V_TRANSPOSE_BATCH
        tune["VT_ADDRESS_STEP"] = FP8_VT_ADDRESS_STEP[dim]
        tune["KV_WHOLE_TILE_COPIES"] = FP8_KV_WHOLE_TILE_COPIES[dim]
        if plain and int(attrs.get("causal", 0)):
            tune.update(FP8_CAUSAL.get(dim, {}))
    unknown = set(tuning or ()) - set(tune)
    if unknown:
        raise ValueError(f"FusedAttention: unknown tuning defines {sorted(unknown)}; known: {sorted(tune)}")
    tune.update(tuning or {})
    block_m, block_n, warps, stages = tune["BLOCK_M"], tune["BLOCK_N"], tune["NUM_WARPS"], tune["KV_STAGES"]
    if tune["WGMMA_OVERLAP"] and not tune["WGMMA"]:
        raise ValueError("FusedAttention: WGMMA_OVERLAP is an option of the wgmma mainloop; set WGMMA=1 too")
    if tune["KV_SPLIT"] > 1 and (tune["WARP_SPECIALIZED"] or arch_number(arch) < CLUSTER_ARCH
                                 or block_m % tune["KV_SPLIT"]):
        raise ValueError(f"FusedAttention: KV_SPLIT (a thread-block cluster splitting the keys) needs a single-role "
                         f"kernel (WARP_SPECIALIZED=0), sm_90 or newer and BLOCK_M divisible by it; got {arch}, "
                         f"WARP_SPECIALIZED={tune['WARP_SPECIALIZED']}, BLOCK_M={block_m}, KV_SPLIT={tune['KV_SPLIT']}")
    pack, key_groups = tune["PACK_GQA"], tune["WARP_SPLIT"]
    if key_groups > 1 and (tune["WARP_SPECIALIZED"] or warps % key_groups or (block_m // (warps // key_groups)) % 16
                           or tune["WGMMA"] and (block_m, warps // key_groups) != (64, 4)):
        raise ValueError(f"FusedAttention: WARP_SPLIT (key groups of warps in a block) needs a single-role kernel "
                         f"(WARP_SPECIALIZED=0) and NUM_WARPS / WARP_SPLIT warps of 16-row multiples (with WGMMA=1 one "
                         f"warpgroup of 64 rows a group); got WARP_SPECIALIZED={tune['WARP_SPECIALIZED']}, "
                         f"WGMMA={tune['WGMMA']}, BLOCK_M={block_m}, NUM_WARPS={warps}, WARP_SPLIT={key_groups}")
    if pack > 1 and (tune["WARP_SPECIALIZED"] or not (isinstance(heads_q, int) and isinstance(heads_kv, int))
                     or pack * heads_kv != heads_q):
        raise ValueError(f"FusedAttention: PACK_GQA (query heads of one K/V head in one tile) needs a single-role "
                         f"kernel (WARP_SPECIALIZED=0) and static head counts with PACK_GQA = query heads / K/V heads; "
                         f"got WARP_SPECIALIZED={tune['WARP_SPECIALIZED']}, heads {heads_q}/{heads_kv}, PACK_GQA={pack}")
    if tune["WARP_SPECIALIZED"] and (tune["WGMMA_OVERLAP"] or (block_m, warps) not in ((128, 8), (192, 12))):
        raise ValueError("FusedAttention: the warp-specialized kernel has its own overlap (WGMMA_OVERLAP=0) and two or "
                         "three MMA warpgroups (BLOCK_M=128, NUM_WARPS=8 or BLOCK_M=192, NUM_WARPS=12)")
    if fp8 and (tune["V_TRANSPOSE_BATCH"] not in (2, 4)
                or tune["V_TRANSPOSE_BATCH"] == 4 and (warps != 8 or tune["PV_OVERLAP"])):
        raise ValueError(f"FusedAttention FP8: V_TRANSPOSE_BATCH is 2 or 4, and 4 (the loader taking 56 registers) "
                         f"needs two MMA warpgroups (NUM_WARPS=8) with PV_OVERLAP=0; got {tune['V_TRANSPOSE_BATCH']} "
                         f"with NUM_WARPS={warps}, PV_OVERLAP={tune['PV_OVERLAP']}")
    if fp8 and tune["VT_ADDRESS_STEP"] not in (0, 1):
        raise ValueError(f"FusedAttention FP8: VT_ADDRESS_STEP is 0 or 1, got {tune['VT_ADDRESS_STEP']}")
    if fp8 and not 1 <= tune["KV_LOAD_LAG"] < min(stages, 4):
        raise ValueError(f"FusedAttention FP8: KV_LOAD_LAG (tiles in flight past the one handed over) must be 1-3 and "
                         f"below KV_STAGES={stages}, got {tune['KV_LOAD_LAG']}")
    if tune["WARP_SPECIALIZED"] and not fp8 and not (0 <= tune["KV_LOAD_LAG"] <= min(stages, 3)
                                                     and (tune["KV_LOAD_LAG"] == 0 or stages > 1)):
        raise ValueError(f"FusedAttention: KV_LOAD_LAG (copy groups in flight past the one handed over) must be 0-3, "
                         f"at most KV_STAGES={stages}, and 0 with one stage; got {tune['KV_LOAD_LAG']}")
    smem = (shared_mem_bytes(dim, block_m, block_n, stages, bool(wgmma), bool(tune["WGMMA_OVERLAP"]), vdim, fp8,
                             key_groups, tune.get("KV_LOAD_LAG", 1))
            + combine_bytes(block_m, block_n, stages, dim, vdim, key_groups, tune["KV_SPLIT"], bool(wgmma)))
    while not wgmma and smem > shared_limit(arch) and not {"BLOCK_N", "KV_STAGES"} & set(tuning or {}):
        # GPUs with 99 KB per block (sm_86, sm_89, sm_120): halve the K/V tile until the stages fit (hd128: 128x32,
        # 68 KB instead of 128x64's 104,448 B), then keep one K/V stage (head dims 257-512)
        if block_n > 16:
            block_n //= 2
        elif stages == 2:
            stages = 1
        else:
            break
        tune["BLOCK_N"], tune["KV_STAGES"] = block_n, stages
        smem = (shared_mem_bytes(dim, block_m, block_n, stages, head_dim_v=vdim, key_groups=key_groups)
                + combine_bytes(block_m, block_n, stages, dim, vdim, key_groups, tune["KV_SPLIT"]))
    persistent = tune.get("PERSISTENT_CTAS", 0)
    if persistent and not tune["WARP_SPECIALIZED"] or persistent < 0:
        raise ValueError(f"FusedAttention: PERSISTENT_CTAS (the persistent grid's CTA count, 0: one CTA a query "
                         f"tile) is an option of the 16-bit warp-specialized kernel; got {persistent}")
    q_stages = 1
    if persistent:  # a second Q buffer where it fits: the next tile's Q then loads during the current tile
        q_tile = block_m * dim * 2
        q_stages = 2 if smem + q_tile + pipeline_barrier_bytes(stages, True, 2) <= shared_limit(arch) else 1
        smem += (q_stages - 1) * q_tile
        tune["Q_STAGES"] = q_stages
    if tune["WARP_SPECIALIZED"]:
        smem += pipeline_barrier_bytes(stages, bool(persistent), q_stages)
    if smem > shared_limit(arch):
        raise ValueError(f"FusedAttention: tile {block_m}x{block_n} at head dim {dim} needs {smem} B of shared memory, "
                         f"more than {arch} has")
    softcap = float(attrs.get("softcap", 0.0))
    if softcap < 0:
        raise ValueError(f"FusedAttention: softcap must be >= 0 (0: no cap), got {softcap}")
    scale = float(attrs.get("scale", 0.0)) or 1.0 / math.sqrt(dim)
    if fp8:
        scale *= float(attrs["q_scale"]) * float(attrs["k_scale"])  # the dequantization folded into the score scale
    causal = int(attrs.get("causal", 0))
    defines = {
        "HEAD_DIM": dim,
        "HEAD_DIM_V": vdim,
        "SOFTCAP": _float_literal(softcap),
        "DTYPE_BF16": int(output_dtype_name(q_dtype, attrs) == "bfloat16"),
        "CAUSAL": causal,
        "CAUSAL_BOTTOM_RIGHT": int(causal and attrs.get("causal_alignment", "top_left") == "bottom_right"),
        "MASK_KIND": MASK_KINDS[mask_kind],
        "HAS_KEY_LENGTHS": int(lengths_shape is not None),
        "SCALE_LOG2": _float_literal(scale * LOG2E),
        **tune,
    }
    if fp8:
        defines.update(_fp8_defines(attrs))
    scalars = (batch, heads_q, heads_kv, len_q, len_kv,
               *_strides(len_q, heads_q, dim, layout), *_strides(len_kv, heads_kv, dim, layout),
               *_strides(len_kv, heads_kv, vdim, layout), *_strides(len_q, heads_q, vdim, layout))
    if mask_kind is not None:
        scalars += _mask_strides(mask_shape, batch, heads_q, len_q, len_kv)
    ws = tune["WARP_SPECIALIZED"]
    m_blocks = (len_q * pack + block_m - 1) // block_m
    grid = ((m_blocks * tune["KV_SPLIT"], heads_kv if pack > 1 else heads_q, batch) if not persistent
            else persistent_grid((m_blocks + causal) // (1 + causal) * heads_q * batch, persistent))
    return LaunchPlan(source=SOURCE_WARP_SPECIALIZED if ws else SOURCE, kernel=KERNEL, defines=defines, grid=grid,
                      block=(warps * 32 + (LOAD_WARPGROUP_THREADS if ws else 0), 1, 1), shared_mem=smem, scalars=scalars)
