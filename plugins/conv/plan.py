"""Launch plan of ``trt_fusedattn::FusedConv``: dimensions and attributes -> kernel specialization, grid, scalars.

One function serves the direct launcher (plain ints) and TensorRT (symbolic batch/spatial dims): channel counts
and the filter are static (they come from the weights), so every choice of kernel and tile is made on them and on
attributes; dims that may be symbolic only enter ``+ - * //`` arithmetic for the grid and the int32 scalars.
Activations are NHWC in memory ("channels-last"), weights OHWI, output NHWC.

Kernels: ``depthwise.cu`` when each group has one input channel (group == C > 1); ``implicit_gemm.cu`` otherwise.
Tile (implicit GEMM, ``default_gemm_tile``): by K/G, the reduction depth kH*kW*C/G and its ratio to K/G, from a
tile sweep over the ResNet-50 / MobileNetV2 layers; BLOCK_K = 64 when C/G is a multiple of 64, else 32; 16-byte
cp.async loads when C/G is a multiple of 8, an element gather otherwise.
FP8 (``input_scale`` != 0, sm_89+): the same implicit-GEMM source with ``FP8=1``: X float16/bfloat16 quantized to
e4m3 while staged, W float8_e4m3fn, BLOCK_K 64 (bytes per operand row as fp16's 32) unless overridden; 16-byte
loads need kH*kW*C/G % 16 == 0 as well (W rows stay 16-byte aligned), else the element gather. On sm_90a the
16-byte path can run its MMAs as wgmma (``WGMMA=1``, every dtype; for FP8 the only way to Hopper's FP8 rate, since
ptxas lowers mma.sync e4m3 to fp16 HMMA there): ``mma="wgmma"``, the default where ``*_WGMMA_BY_DEFAULT`` is set.
On sm_90+ the reduction can also be split over a thread-block cluster (``CLUSTER_K``, summed through distributed
shared memory) and walked taps-inner with A through L1 (``TAPS_INNER``).
"""
from __future__ import annotations

import math
from pathlib import Path

from trt_fusedattn.launcher.arch import CLUSTER_ARCH, SM_COUNT, WGMMA_ARCHES, arch_number, shared_limit
from trt_fusedattn.launcher.plan import LaunchPlan
from trt_fusedattn.tensorrt import CHANNELS_LAST_FORMATS

HERE = Path(__file__).resolve().parent
IMPLICIT_GEMM = HERE / "implicit_gemm.cu"
IMPLICIT_GEMM_SM90 = HERE / "implicit_gemm_sm90.cu"  # warp-specialized (mma="wgmma_ws")
DEPTHWISE = HERE / "depthwise.cu"
ELEMENT_DTYPES = ("float16", "bfloat16")


def float_literal(value: float) -> str:
    """A C++ expression for ``value`` exactly (hex float; infinities as bit patterns)."""
    value = float(value)
    if math.isinf(value):
        return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
    if math.isnan(value):
        raise ValueError("activation parameter is NaN; give a finite number or +-inf")
    return value.hex()


def _static(value, what: str) -> int:
    if not isinstance(value, int):
        raise ValueError(f"FusedConv needs {what} static (known when the engine is built); got {value!r}")
    return value


def _largest_vector(*counts: int) -> int:
    """The widest access (8, 4, 2 or 1 elements) that divides every count."""
    return next(v for v in (8, 4, 2, 1) if all(c % v == 0 for c in counts))


def conv_geometry(x_shape, w_shape, attrs) -> dict:
    """Static conv facts and (maybe symbolic) sizes, 1-D mapped onto 2-D with H = kH = 1."""
    nd = len(x_shape) - 2
    if nd not in (1, 2) or len(w_shape) != nd + 2:
        raise ValueError(f"FusedConv takes 1-D or 2-D convolutions (X [N,C,(H,)W], W [K,(kH,)kW,C/G]); "
                         f"got X {tuple(x_shape)}, W {tuple(w_shape)}")
    k_out, *kernel, cg = (_static(d, "W's shape") for d in w_shape)
    group = attrs["group"]
    c = group * cg
    if isinstance(x_shape[1], int) and x_shape[1] != c:
        raise ValueError(f"X has {x_shape[1]} channels but W [K,...,C/G] = {tuple(w_shape)} with group={group} "
                         f"needs {c}")
    if k_out % group:
        raise ValueError(f"output channels K={k_out} are not a multiple of group={group}")
    strides = attrs["strides"] or (1,) * nd
    pads = attrs["pads"] or (0,) * (2 * nd)
    dilations = attrs["dilations"] or (1,) * nd
    if len(strides) != nd or len(pads) != 2 * nd or len(dilations) != nd:
        raise ValueError(f"strides {strides}, pads {pads}, dilations {dilations} do not fit a {nd}-D convolution")
    if min(strides) < 1 or min(dilations) < 1 or min(pads) < 0:
        raise ValueError(f"strides {strides} and dilations {dilations} must be >= 1, pads {pads} >= 0")
    if nd == 1:
        kernel, strides, dilations = [1, *kernel], (1, *strides), (1, *dilations)
        pads, spatial = (0, pads[0], 0, pads[1]), (1, x_shape[2])
    else:
        spatial = tuple(x_shape[2:])
    sizes = [(spatial[i] + pads[i] + pads[i + 2] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1
             for i in range(2)]
    return dict(N=x_shape[0], C=c, H=spatial[0], W=spatial[1], K=k_out, P=sizes[0], Q=sizes[1], G=group, Cg=cg,
                Kg=k_out // group, KH=kernel[0], KW=kernel[1], strides=strides, dilations=dilations, pads=pads)


def epilogue_defines(attrs, has_shift: bool, has_scale: bool, has_residual: bool) -> dict:
    """-D defines of epilogue.cuh (activation names pass straight through: the kernels name theirs alike)."""
    return {
        "ACTIVATION": attrs["activation"],
        "ACTIVATION_ALPHA": float_literal(attrs["activation_alpha"]),
        "ACTIVATION_BETA": float_literal(attrs["activation_beta"]),
        "POST_ACTIVATION": attrs["post_activation"],
        "POST_ACTIVATION_ALPHA": float_literal(attrs["post_activation_alpha"]),
        "POST_ACTIVATION_BETA": float_literal(attrs["post_activation_beta"]),
        "HAS_SHIFT": int(has_shift), "HAS_SCALE": int(has_scale), "HAS_RESIDUAL": int(has_residual),
    }


# Implicit-GEMM CTA tiles: name -> (BLOCK_M, BLOCK_N, WARPS_M, WARPS_N, SPLIT_K); "s2" tiles put two warp groups
# on one output tile, each taking every other reduction tile. Under wgmma a group's warps form warpgroups of 4,
# each owning BLOCK_M / warpgroups rows (a multiple of 64) and every column (BLOCK_N 32, 64, 128 or 256).
GEMM_TILES = {
    "128x256w8": (128, 256, 2, 4, 1), "128x128w4": (128, 128, 2, 2, 1), "128x128w8": (128, 128, 2, 4, 1),
    "128x64w4": (128, 64, 2, 2, 1), "64x128w4": (64, 128, 2, 2, 1), "64x64w4": (64, 64, 2, 2, 1),
    "128x32w4": (128, 32, 4, 1, 1), "128x64w4s2": (128, 64, 2, 2, 2), "128x32w4s2": (128, 32, 4, 1, 2),
    "64x64w4s2": (64, 64, 2, 2, 2), "64x64w4s4": (64, 64, 2, 2, 4), "64x256w4": (64, 256, 1, 4, 1),
    "128x64w8": (128, 64, 4, 2, 1), "128x128w8s2": (128, 128, 2, 4, 2), "64x128w4s2": (64, 128, 2, 2, 2),
    "256x128w8": (256, 128, 2, 4, 1), "192x128w12": (192, 128, 3, 4, 1), "256x64w8": (256, 64, 4, 2, 1),
}
# The warp-specialized Hopper kernel (implicit_gemm_sm90.cu): a load warpgroup feeding two MMA warpgroups through a
# ring of up to WS_MAX_STAGES stages; its tiles are the 8-warp wgmma tiles without split groups, 192x128 on three
# MMA warpgroups (WS_ONLY_TILES: the unspecialized loop is not built for 12 warps), and the 4-warp 64-row tiles on one
# (WS_ONE_WARPGROUP_TILES: twice the CTAs of 128-row tiles on short grids; 64x64 is the default of short 1x1 grids,
# default_rows64_tile).
WS_LOAD_THREADS = 128
WS_RING_OFFSET = 1024  # the ring's mbarriers, before the 1024-byte-aligned stages
WS_MAX_STAGES = 6
WS_ONLY_TILES = ("192x128w12",)
WS_ONE_WARPGROUP_TILES = ("64x64w4", "64x128w4", "64x256w4")
# The warp-specialized kernel is sm_90a's float16/bfloat16 default where default_ws_tile picks it (NOTES.md), and FP8's
# with e4m3 X where the output is too small for the channel tile (narrowed or split over a cluster: faster at batch 1
# and 8 in conv-2) or takes 192-row tiles (b32 3x3 128 @28: 14.3 µs, the unspecialized FP8 loop 15.9; session 5).
FP16_WARP_SPECIALIZED_BY_DEFAULT = True
FP8_WARP_SPECIALIZED_BY_DEFAULT = True
# W tiles shared by M-tile pairs in the warp-specialized default (default_share_w): off, since conv-2 (H100) timed them
# 20-50% slower than the unshared kernel on every layer and tile (NOTES.md).
SHARE_W_BY_DEFAULT = False
# Half the SMs of an H100 / H200 SXM: a static output with fewer CTAs than this gets narrower tiles and then a
# cluster split of the reduction.
WS_MIN_CTAS = SM_COUNT // 2
# CTAs of a reduction split over N-CTA clusters that run at once on an H100 / H200 SXM (132 SMs in GPCs of 16-18; a
# cluster takes SMs of one GPC): beyond this the grid runs in two waves (H100 sweeps: 32 4-CTA clusters took twice the
# time of 8, 52 3-CTA clusters twice that of 32; 26 4-CTA clusters ran in one wave, session 6 conv-1), and the least
# reduction tiles each CTA keeps: 2 since every rank shares the cluster sum (session 6 sweeps at batch 1, H100: 16-tile
# 1x1 reductions 6.3 µs on 4 CTAs of 4 tiles, 7.6 on 2 of 8; 8-tile ones, 1x1 512>128 @28, 5.6 on 4 CTAs of 2, 5.9 on
# 3, 6.2 on 2 of 4).
CLUSTER_CTA_CAP = {2: 132, 3: 120, 4: 104}
WS_MIN_RANK_TILES = 2
# The cluster ranks' pushed sums past the warp-specialized ring (PUSHED_OFFSET, implicit_gemm_reduction.cuh): a rank
# pushes once its own MMAs are done, one cluster barrier instead of two, and no other CTA writes into a ring. Where
# shared memory holds them with a ring of at least PUSHED_MIN_STAGES stages (one fewer than the 6 a 128x128 tile on
# 4-CTA clusters takes otherwise). Session 7 conv-1 sweep (H100, same run): every clustered layer 0.4-0.6 µs faster
# (b1 1x1 512>2048 +res 6.0 -> 5.4, b8 1x1 1024>256 @14 7.6 -> 7.1, 3x3 512 @7 13.2 -> 12.7); 128x128 c4 on 5 stages
# with them vs 6 without: b8 3x3 256 @14 10.1 vs 10.7, b1 3x3 128 @28 8.0 vs 8.7.
PUSHED_PAST_RING = True
PUSHED_MIN_STAGES = 5
# The same on the unspecialized wgmma loop (implicit_gemm.cu; the GPU-tested cluster cases run wgmma) where the ring
# keeps its depth and the SM as many blocks by shared memory: the FP8 b32 512-channel 3x3 layers' 128x128 2-CTA split
# (4 stages, 160 KB with the sums).
PUSHED_PAST_RING_UNSPECIALIZED = True
# Float16/bfloat16 reductions of at least this many tiles split a short grid's tile (128 columns at most: a 128x256
# tile's fp32 partial sums are twice the size, not measured) over a cluster before narrowing it, where the split grid
# fills half the SMs (WS_MIN_CTAS) at once with >= WS_SPLIT_FIRST_RANK_TILES tiles a rank: a narrower tile re-reads more
# operand bytes per MAC (session 6 sweeps, H100: b8 3x3 256 @14 11.0 µs on 128x128 over 4-CTA clusters, 11.8 on 128x64
# over 2; b32 1x1 2048>512 @7 13.3 on 128x128 over 2, 15.2 on 128x64; a 16-tile 1x1 reduction lost it: 1x1 1024>512
# @14 b8 9.5 vs 9.1). Their 3x3 filters, where 128x128 tiles make one part-filled wave, take 192-row tiles on 2-CTA
# clusters where those fill the SMs at once (b32 3x3 256 @14 and 3x3/2 256 @28, 98 tiles of 128x128: 20.3 µs on 132
# CTAs of 192x128 c2, 21.1-21.3 on 128x128; 1x1 1024>256 @14, 16 tiles, lost it: 13.3 vs 11.6). FP8 keeps narrowing
# first (not measured split first).
WS_SPLIT_FIRST_TILES = 32
WS_SPLIT_FIRST_RANK_TILES = 8
# The time of one CTA's tile relative to 128x128's on the WS kernel (conv-2 sweep at
# batch 32: 256x128 in one wave 21.6 µs where 128x128 took two, 23.8; 128x64 in two waves 31.7 where 128x128 took one,
# 20.7): the tile rule's waves-times-cost for grids of >= WS_MIN_CTAS CTAs. 192x128 (N*P*Q = 25088 makes 131 such
# tiles, one wave): measured 1.44-1.58 (session 5 conv-1); 1.4 orders every measured case right, where 1.5 would tie
# 1x1 512>256 @28 and 1x1/2 512>1024 @28 with 128x128 and keep the slower 128x128.
WS_TILE_COST = {"128x128w8": 1.0, "256x128w8": 1.8, "128x256w8": 1.8, "128x64w8": 0.75, "192x128w12": 1.4}
# The unspecialized wgmma loop's 3-stage ring for 256-deep reductions on 128x128 tiles (gemm_tile) only on static
# grids of more CTAs than SMs: with fewer no second CTA shares an SM, and 4 stages were ~5% faster (lead's H100 run,
# session 4).
THREE_STAGE_MIN_CTAS = SM_COUNT + 1
# K/G <= 64 on a static grid of more than two 128x64 tiles per SM: the one-warpgroup 128x64 tile on a 3-stage ring (72
# KB: three CTAs an SM) instead of two warpgroups on 4 (session 6 conv-2's short sweep at batch 32, H100: 1x1 64>64 @56
# 10.6 µs vs 12.0, 3x3 64 @56 27.2 vs 29.8, 1x1 256>64 @56 27.3 vs 28.7; at batch 8, 196 CTAs, 3x3 64 @56 was faster on
# two warpgroups, 10.0 vs 10.5).
ONE_WARPGROUP_MIN_CTAS = 2 * SM_COUNT + 1
# 1x1 layers on static grids too small for a 128-row tile (fewer than WS_MIN_CTAS of the channel tile the rules above
# pick, before any reduction split): 64x64 tiles on the warp-specialized kernel's one MMA warpgroup, twice the CTAs of
# 128x64 with the whole reduction each; where even those are fewer than WS_MIN_CTAS, the reduction splits over the
# largest cluster whose CTAs fit at once (CLUSTER_CTA_CAP) with >= ROWS64_RANK_TILES tiles a rank; a reduction of
# >= WS_SPLIT_FIRST_TILES tiles only where it splits (wider tiles re-read fewer bytes per MAC on the grids that are not
# short). prep-conv-next's small_grids sweep (H100, 2026-11-24 22:19, µs; default = the rule before this one):
# b1 1x1 64>64 @56 3.6 vs 4.2, 64>256 @56 3.9 vs 4.9, 256>64 @56 4.1 vs 5.3, 256>128 @56 4.1 vs 6.1, 128>512 @28 +res
# 4.0 vs 6.0, 256>1024 @14 +res 4.4 vs 6.7; split: 512>256 @28 c2 4.9 vs 5.4, 512>2048 @7 +res c2 5.0 vs 5.5, 512>128
# @28 c2 4.7 (c4 4.5) vs 5.2, 1024>256 @14 c4 4.7 vs 5.7, 2048>512 @7 c4 5.7 vs 7.3; b8 1024>256 @14 (52 CTAs of
# 128x64 before the split) 6.8 vs 7.0. Splits of 4 tiles a rank lost (b1 256>64 @56 c2 4.4, 256>1024 +res c2 4.6); b8
# 512>128 @28 and 1024>512 @14 (98-104 CTAs of 128x64) tied or lost on 64-row tiles (6.4 vs 6.3, 9.3 vs 9.1): not taken.
ROWS64_BY_DEFAULT = True
ROWS64_RANK_TILES = 4
# Their ring: 4 stages. Session 8 conv-2's deep_rings sweep (H100, 64x64 unsplit, b1 and b8): 4 stages faster than 6 on
# all 12 rows, 0.1-0.7 µs (b8 1x1 1024>256 @14 6.6 vs 7.0, 3x3 256 @14 11.0 vs 11.7, 1x1 1024>512 9.0 vs 9.6; b1 2048>512
# 9.7 vs 10.2), 8 stages as fast as 4 where one CTA an SM holds the grid, 6, 10 and 12 the slowest: a depth that is not
# a power of two costs the MMA warpgroup a division per tile (stage, parity) on a path 64-row tiles do not hide.
ROWS64_STAGES = 4
# FP8 with e4m3 X, filters larger than 1x1, where the warp-specialized rule splits a short grid's 128-row tile over a
# cluster: 64x64 tiles, unsplit where those make >= WS_MIN_CTAS CTAs, else on 2-CTA clusters where those do (session 8
# conv-2's FP8 table, H100, b8: 3x3 256 @14 7.8 µs vs 9.1 on 128x64 c2, 3x3/2 256 @28 7.7 vs 9.0, 3x3 512 @7 8.3 vs 10.0
# (c4 8.0), 3x3/2 512 @14 8.3 vs 10.0 (c4 8.2); 64x128 c2 8.7-12.4; the ring as the 128-row tiles': 6 stages). Unsplit
# (100 CTAs of 18 tiles) since session 10 (H100, b8, conv-1 / conv-2): 3x3 256 @14 7.0 / 6.7 µs vs 7.2 / 7.0 on c2,
# 3x3/2 256 @28 6.9 / 7.0 vs 7.2 / 7.7; the 512-channel pair (56 CTAs unsplit) keeps c2.
FP8_ROWS64_BY_DEFAULT = True
FP8_ROWS64_UNSPLIT_MIN_CTAS = WS_MIN_CTAS
# FP8 with e4m3 X: the large-grid warp-specialized tiles that beat the unspecialized loop. 192x128 (session 5 conv-1:
# b32 3x3 128 @28 14.3 µs vs 15.9); 128x128 since the loader and prologue trims of sessions 9-10 (session 10 conv-2,
# H100, b32 3x3 256 @14 11.3 µs vs 12.9, 3x3/2 256 @28 11.2 vs 13.5; it had lost 16.5 vs 12.9 in session 4).
FP8_WS_LARGE_GRID_TILES = ("192x128w12", "128x128w8")
# FP8 with e4m3 X, deep reductions (>= 4096) whose narrowed unsplit grid fills the SMs: the WS 128x128 on 2-CTA clusters
# (b32 3x3 512 @7 and 3x3/2 512 @14: 12.9 / 13.0 µs vs 14.9 on the unspecialized 2-CTA split, session 10 conv-3, H100;
# the narrowed WS 128x64 took 22, session 4), else the unspecialized split.
FP8_WS_DEEP_SPLIT = True
# FP8 with e4m3 X on the unspecialized loop, one BLOCK_K of channels (C/G 64), a filter larger than 1x1, a static grid
# of more than two tiles an SM: taps inner, A through L1 (consecutive tiles read overlapping windows). Session 10
# (H100, 3x3 64 @56): b32 (784 CTAs) 19.6 / 19.2 µs vs 20.6 / 21.2 (conv-1 / conv-2); b8 (196) 8.1 vs 8.0: not there.
FP8_TAPS_INNER_MIN_CTAS = 2 * SM_COUNT + 1
# Those layers with K/G <= 64 on 256x64 tiles (two 64-row blocks a warpgroup, 128 registers: two CTAs an SM) instead of
# 128x64 (four an SM): half the CTAs, each with half the W bytes and prologue per MAC. Session 11 conv-1 (H100, b32
# 3x3 64 @56, 784 CTAs of 128x64): 17.7 µs vs 19.5 (ncu of the 128x64: issue slots 62% busy, L2 29%, L1 hits 49%);
# 64x64 23.8, 128x64 on 3 / 6 stages 19.7 / 20.1, 256x64 on 3 stages 18.6, the WS kernel 21.0-27.5.
FP8_ROWS256_TAPS_INNER = True
# FP8 with e4m3 X on the warp-specialized kernel: BLOCK_K 128 (128-byte rows: half the tiles, each twice the MMAs a
# hand-over) from this many channels where C/G % 128 == 0; the unspecialized loop keeps it from 256 (its b32 128x128
# tiles were slower at 128 on 128 channels, 16.2 vs 15.7 µs, session 3). Session 10 conv-1 (H100, e4m3 X): b8 3x3/2
# 128 @56 and 3x3 128 @28 on ws 128x64 6.2 / 6.3 µs vs 7.3 / 7.3 at 64; b32 on ws 192x128 11.5 / 11.6 vs 12.2 / 12.4.
FP8_WS_BLOCK_K128_MIN_CG = 128
# FP8 with e4m3 X, filters larger than 1x1, static outputs too short for WS_MIN_CTAS 128x64 tiles (batch 1) over
# reductions of at most this many 128-byte tiles: 64x64 tiles on the warp-specialized kernel's one MMA warpgroup,
# unsplit, BLOCK_K 128 (over 64 channels a tile spans two taps). Session 10 conv-2 (H100, b1): 3x3 64 @56 4.3 µs vs 5.9
# on the unspecialized 128x64 (25 CTAs), 3x3/2 128 @56 and 3x3 128 @28 4.8 / 4.9 vs 5.3 / 5.4 on ws 128x64 c4 (56
# CTAs); the 256-channel layers (18 tiles) lost it: 6.6 / 6.5 vs 6.0 / 5.8 on c4.
FP8_ROWS64_SHORT_MAX_TILES = 9
# The wgmma main loop is the default on sm_90a since its GPU tests passed and it timed faster (NOTES.md); for FP8 it is
# the only way to Hopper's FP8 rate (ptxas lowers mma.sync e4m3 to fp16 HMMA there).
FP8_WGMMA_BY_DEFAULT = True
FP16_WGMMA_BY_DEFAULT = True
# The tap-row gather (implicit_gemm_load_tap_rows.cuh) by default where a filter row of the element gather fills more
# than half of a 32-element reduction tile (the 7x7 stem over 3 channels: 21; MobileNetV2's 3x3 stem, 9, would more
# than double its tensor-core work for it).
TAP_ROWS_BY_DEFAULT = True
# Blocks per SM the tap-row kernel's registers are capped for (__launch_bounds__: 3 -> 152 registers, 4 -> 127; 5
# spill), and the time of a wave of them relative to 3's: tap_rows_blocks takes the fewest waves times this cost. From
# conv-3's stem sweep (H100): at b32 (3136 CTAs) 4 blocks took 92.7 µs over 6 waves where 3 took 103.0 over 8; at b8
# (784: two waves either way) and b1 (98) 3 were faster (25.6 vs 28.2, 10.7 vs 11.5). 4 blocks run 3 stages (never
# slower in the same sweep: 90.2, 28.2, 11.1). Older arches keep 3 (at 4 the 3x3 over 6 channels spills on sm_80).
TAP_ROWS_WAVE_COST = {3: 1.0, 4: 1.2}
# Output pixels per depthwise thread (depthwise.cu DW_PIX) for stride-1 filters on static grids that keep at least
# SM_COUNT blocks with them: 2 (session 7 conv-2 sweep, H100: dw 192 @28 b32 20.5 -> 16.5 µs, dw 576 @14 b32 16.5 ->
# 12.6, dw 32 @112 b32 42.3 -> 39.2, b8 dw 144 @56 13.4 -> 12.0; dw 960 @7 b8, 105 blocks at 2 pixels, lost: 4.8 vs
# 5.2; dw 144 @56 b32 46.8 vs 47.2). Stride 2 lost at every size (dw/2 96 @112 b32 53.3 vs 67.3), 4 pixels on most
# (won only dw 192 @28 and dw 384 @14 at b32, 15.5 / 9.6 vs 16.5 / 11.1 at 2, and dw 32 @112 b8): 1 there.
DEPTHWISE_PIXELS = 2
# Stride-2 depthwise layers whose default block reads fewer than DW_WHOLE_PIXEL_BYTES of each input pixel (a warp's
# loads then take 16-32 bytes of each of 16 pixels) put every channel chunk in one block, DEPTHWISE_PIXELS pixels a
# thread, where that grid makes >= DW_WHOLE_PIXEL_MIN_WAVES waves of SM_COUNT blocks (depthwise_whole_pixels). Session 7
# conv-3's chunk sweep (H100, b32): dw/2 144 @56 on 18 chunks x 2 pixels 18.5 µs vs 24.5 on 2 chunks x 1 (32 bytes a
# pixel); dw/2 96 @112 (4 chunks, 64 bytes) 51.3 at 12 chunks x 1 vs 53.3, x 2 56.2: not taken; stride 1 lost
# everywhere (dw 144 @56 50.2 vs 47.5). Session 8 conv-3's anchor: b32 (896 blocks, 6.8 waves) 18.7 vs 24.4, b8 (224
# blocks, 1.7 waves) 7.0 vs 6.1: a wave count between the two, 4.
DW_WHOLE_PIXEL_BYTES = 64
DW_WHOLE_PIXEL_MIN_WAVES = 4


def default_gemm_tile(cg: int, kg: int, taps: int) -> tuple[str, int | None]:
    """(tile, BLOCK_K or None for the default) of the mma.sync main loop for a group's C/G input and K/G output
    channels and kH*kW taps.

    From the tile sweep on H100 (NOTES.md): 128x64 with BLOCK_K 64 wins most ResNet-50 layers; narrow outputs
    (K/G <= 32) and 1x1 projections that reduce >= 3x over <= 320 outputs (MobileNetV2) want 128x32; wide 1x1
    outputs (K/G >= 1024) 128x128 with BLOCK_K 32; deep reductions (>= 2048) split over two warp groups."""
    reduction = taps * cg
    if kg >= 1024:
        return "128x128w4", 32
    if kg <= 32 or (taps == 1 and reduction >= 3 * kg and kg <= 320):
        tile = "128x32w4"
    else:
        tile = "128x64w4"
    return (tile + "s2" if reduction >= 2048 else tile), None


def default_wgmma_tile(cg: int, kg: int, taps: int) -> tuple[str, int] | None:
    """(tile, cluster) of the wgmma main loop, or None where mma.sync's 128x32 tile is faster (K/G <= 32), from
    the wgmma sweeps of the ResNet-50 and MobileNetV2 layers at batch 32 on H100 (NOTES.md): two warpgroups of
    64x128 win most layers (MobileNetV2's 1x1 projections onto 96..320 outputs would take 128x64, ResNet's onto
    128/256 outputs not: the channel counts cannot tell them apart); K/G <= 64 wants 128x64;
    deep reductions onto K/G 512 (few output tiles: 3x3 512 at 7x7) split the reduction over a 2-CTA cluster;
    wide outputs over reductions >= 1024 want 128x256."""
    reduction = taps * cg
    if kg <= 32:
        return None
    if kg <= 64:
        return "128x64w8", 1
    if 512 <= kg < 1024 and reduction >= 2048:
        return "128x128w8", 2
    if kg >= 512 and reduction >= 1024:
        return "128x256w8", 1
    return "128x128w8", 1


def default_ws_tile(cg: int, kg: int, taps: int, pixels: int | None, block_k: int = 64,
                    small_grids_only: bool = False) -> tuple[str, int] | None:
    """(tile, cluster) of the warp-specialized kernel, or None where the unspecialized loops are as fast, from the WS
    sweeps on H100 (NOTES.md): reductions of >= 1024 (16 tiles of 64), and 1x1 reductions of >= 512, pay for the ring;
    128x64 for K/G <= 64, 128x256 for wide 1x1 outputs, else 128x128. With the output size static (``pixels`` = N*P*Q
    an int) a tile that leaves most SMs idle narrows (128x256 -> 128x128 -> 128x64) and, still short, splits the
    reduction over the largest cluster whose CTAs all fit on the SMs at once (CLUSTER_CTA_CAP) with >= WS_MIN_RANK_TILES
    reduction tiles each; deep float16/bfloat16 reductions (>= WS_SPLIT_FIRST_TILES tiles: 3x3 over 256+ channels,
    1x1 over 2048) split before they narrow where the split grid fills half the SMs, since narrower tiles re-read more
    operand bytes per MAC from L2. A grid of enough CTAs takes the tile of the fewest waves times its cost per CTA
    (WS_TILE_COST: 256x128 tiles win where 128x128 spill into a second wave); a deep 3x3 reduction whose 128x128 tiles
    make one part-filled wave takes 192x128 on 2-CTA clusters where those fill the SMs. ``block_k``:
    reduction elements per tile (FP8 with e4m3 X: 128 over >= 256 channels, the same 128-byte rows as float16's 64).
    ``small_grids_only``: None unless the output is static and too small for the channel tile, and the tile is split
    over a cluster or the reduction is below 4096, or the waves rule picks 192x128 (FP8 with e4m3 X: where the WS
    kernel was timed faster, conv-3 and session 5's conv-1)."""
    reduction = taps * cg
    if reduction < 1024 and not (taps == 1 and reduction >= 512):
        return None
    tile = "128x64w8" if kg <= 64 else "128x256w8" if taps == 1 and kg >= 512 else "128x128w8"
    if not isinstance(pixels, int):
        return None if small_grids_only else (tile, 1)
    ctas = lambda name: output_tiles(pixels, kg, *GEMM_TILES[name][:2])  # noqa: E731
    k_tiles = -(-reduction // block_k)
    deep = not small_grids_only and k_tiles >= WS_SPLIT_FIRST_TILES
    if ctas(tile) >= WS_MIN_CTAS:
        if deep and taps > 1 and tile == "128x128w8" and ctas(tile) <= SM_COUNT \
                and 2 * ctas("192x128w12") <= CLUSTER_CTA_CAP[2]:
            return "192x128w12", 2  # one part-filled wave of 128x128: 192-row tiles on 2-CTA clusters fill the SMs
        waves = lambda name: -(-ctas(name) // SM_COUNT) * WS_TILE_COST[name]  # noqa: E731
        best = min([tile] + [t for t in WS_TILE_COST if t != tile and GEMM_TILES[t][1] <= kg], key=waves)
        if small_grids_only and best not in FP8_WS_LARGE_GRID_TILES:
            return None  # FP8 e4m3 X: the unspecialized loop where it was faster
        return best, 1
    split_first = lambda name: deep and GEMM_TILES[name][1] <= 128 and any(  # noqa: E731
        WS_MIN_CTAS <= ctas(name) * c <= cap and k_tiles >= WS_SPLIT_FIRST_RANK_TILES * c
        for c, cap in CLUSTER_CTA_CAP.items())
    for narrower in ("128x128w8", "128x64w8"):
        if ctas(tile) < WS_MIN_CTAS and not split_first(tile) and GEMM_TILES[narrower][1] < GEMM_TILES[tile][1]:
            tile = narrower
    cluster = short_grid_cluster(ctas(tile), k_tiles, WS_MIN_RANK_TILES)
    if small_grids_only and cluster == 1 and reduction >= 64 * 64:  # FP8 3x3 over 512 channels at batch 32
        two = 2 * ctas("128x128w8")
        return ("128x128w8", 2) if FP8_WS_DEEP_SPLIT and WS_MIN_CTAS <= two <= CLUSTER_CTA_CAP[2] else None
    return tile, cluster


def short_grid_fp8_rows64(cg: int, kg: int, taps: int, pixels: int | None) -> bool:
    """Whether an FP8 layer with e4m3 X takes 64x64 tiles unsplit at BLOCK_K 128 (FP8_ROWS64_SHORT_MAX_TILES): a filter
    larger than 1x1, C/G % 64 == 0, a static output of fewer than WS_MIN_CTAS 128x64 tiles, a reduction of at most
    FP8_ROWS64_SHORT_MAX_TILES tiles of 128."""
    return (taps > 1 and cg % 64 == 0 and isinstance(pixels, int) and -(-taps * cg // 128) <= FP8_ROWS64_SHORT_MAX_TILES
            and output_tiles(pixels, kg, 128, 64) < WS_MIN_CTAS)


def default_rows64_tile(kg: int, taps: int, pixels: int | None, k_tiles: int,
                        choice: tuple[str, int] | None) -> tuple[str, int] | None:
    """(tile, cluster) of the 64-row warp-specialized tile for a 1x1 layer whose static output is too small for the
    128-row ``choice`` of the other rules (ROWS64_BY_DEFAULT), or None where that choice stays. ``k_tiles``: reduction
    tiles of the whole reduction."""
    if not (ROWS64_BY_DEFAULT and taps == 1 and kg > 32 and isinstance(pixels, int) and choice) \
            or output_tiles(pixels, kg, *GEMM_TILES[choice[0]][:2]) >= WS_MIN_CTAS:
        return None
    cluster = short_grid_cluster(output_tiles(pixels, kg, 64, 64), k_tiles, ROWS64_RANK_TILES)
    return None if cluster == 1 and k_tiles >= WS_SPLIT_FIRST_TILES else ("64x64w4", cluster)


def short_grid_cluster(ctas: int, k_tiles: int, rank_tiles: int) -> int:
    """Cluster size a warp-specialized grid of ``ctas`` CTAs splits its ``k_tiles`` reduction tiles over: 1 where the
    grid has WS_MIN_CTAS, else the largest cluster whose CTAs fit at once (CLUSTER_CTA_CAP) with >= ``rank_tiles``
    tiles a rank (1 where none does)."""
    if ctas >= WS_MIN_CTAS:
        return 1
    return max((c for c, cap in CLUSTER_CTA_CAP.items() if ctas * c <= cap and k_tiles >= rank_tiles * c), default=1)


def output_tiles(pixels: int, kg: int, block_m: int, block_n: int) -> int:
    """Output tiles (CTAs) of one conv group over a static output: ``pixels`` = N*P*Q rows by ``kg`` channels."""
    return -(-pixels // block_m) * -(-kg // block_n)


def tap_rows_fit(config: dict, geo: dict, fp8: bool) -> bool:
    """Whether the element gather's tile can take the tap-row loader: float16/bfloat16, one group, undilated filter rows
    of KW * C/G <= 32 elements over a taller filter, BLOCK_K 32 without split groups, a thread per A row."""
    warps = config["WARPS_M"] * config["WARPS_N"]
    return (config["IN_VEC"] == 1 and not fp8 and geo["G"] == 1 and geo["dilations"][1] == 1 and geo["KH"] > 1
            and config["BLOCK_K"] == 32 and geo["KW"] * geo["Cg"] <= 32 and config["SPLIT_K"] == 1
            and "CLUSTER_K" not in config and warps * 32 == config["BLOCK_M"] and config["BLOCK_N"] % warps == 0)


def tap_rows_blocks(ctas: int | None, arch: str) -> int:
    """Blocks per SM for the tap-row kernel's register cap: on sm_90a with a static grid of ``ctas`` blocks, the count
    of the fewest waves times TAP_ROWS_WAVE_COST (3 on a tie); 3 otherwise."""
    if not isinstance(ctas, int) or arch not in WGMMA_ARCHES:
        return 3
    return min(TAP_ROWS_WAVE_COST, key=lambda b: -(-ctas // (b * SM_COUNT)) * TAP_ROWS_WAVE_COST[b])


def default_share_w(cluster: int, pixels: int | None) -> bool:
    """Whether the warp-specialized default shares W tiles between M-tile pairs (SHARE_W_BY_DEFAULT: off) where the
    output size is static and the reduction is not split over a cluster."""
    return SHARE_W_BY_DEFAULT and cluster == 1 and isinstance(pixels, int)


def wgmma_fits(name: str) -> bool:
    """The wgmma main loop takes a tile of whole warpgroups, 64-row blocks each, 32..256 columns."""
    block_m, block_n, warps_m, warps_n, _ = GEMM_TILES[name]
    warps = warps_m * warps_n
    return warps % 4 == 0 and (block_m // (warps // 4)) % 64 == 0 and block_n in (32, 64, 128, 256)


def gemm_tile(cg: int, kg: int, taps: int, arch: str, tile: str | None = None, block_k: int | None = None,
              stages: int | None = None, fp8: bool = False, mma: str | None = None, cluster: int | None = None,
              taps_inner: bool | None = None, x_e4m3: bool = False, pixels: int | None = None,
              ws_ctas: int | None = None, share_w: bool | None = None) -> dict:
    """Compile-time tile of the implicit GEMM, chosen on the static channel counts (every argument after ``arch``
    but ``fp8`` overrides the choice, for tuning); pipeline stages shrink to fit ``arch``'s shared memory, and a
    default split tile that still does not fit loses its split. ``fp8``: the e4m3 specialization. ``mma``:
    "wgmma" or "mma.sync" (wgmma only on sm_90a with 16-byte loads and a tile of whole warpgroups; None: the
    ``*_WGMMA_BY_DEFAULT`` switch); ``cluster``: CTAs splitting the reduction (sm_90+); ``taps_inner``: the
    taps-inner reduction order with A through L1 (needs C/G % BLOCK_K == 0 and a filter larger than 1x1);
    ``x_e4m3``: X already e4m3 in global memory (FP8, C/G % 16 == 0: A moves as bytes, no quantize pass).
    ``pixels``: N*P*Q where static (an int), for the warp-specialized kernel's tile and cluster choice.
    ``ws_ctas``: 2 runs two warp-specialized blocks per SM (each within half the shared memory and registers).
    ``share_w``: the warp-specialized kernel on 2-CTA clusters of adjacent M tiles that load one W tile between them
    (each half, pushed to the other through DSMEM; no cluster split of the reduction)."""
    if mma not in (None, "wgmma", "wgmma_ws", "mma.sync"):
        raise ValueError(f"mma={mma!r}: give 'wgmma', 'wgmma_ws' (warp-specialized) or 'mma.sync'")
    warp_specialized = mma == "wgmma_ws"
    if warp_specialized and ((fp8 and not x_e4m3) or arch not in WGMMA_ARCHES or cg % 8):
        raise ValueError(f"mma='wgmma_ws' runs float16/bfloat16 with C/G % 8 == 0, or FP8 with e4m3 X, on sm_90a; got "
                         f"{'FP8 with float16/bfloat16 X' if fp8 and not x_e4m3 else 'C/G = ' + str(cg)} on {arch}")
    # FP8 with e4m3 X: 128-byte rows (BLOCK_K 128) over >= 256 channels (wgmma sweep, NOTES.md), on the
    # warp-specialized kernel over >= FP8_WS_BLOCK_K128_MIN_CG, else 64
    fp8_block_k = lambda ws: 128 if x_e4m3 and cg % 128 == 0 and cg >= (  # noqa: E731
        FP8_WS_BLOCK_K128_MIN_CG if ws else 256) else 64
    by_default_ws = (FP8_WARP_SPECIALIZED_BY_DEFAULT and x_e4m3) if fp8 else FP16_WARP_SPECIALIZED_BY_DEFAULT
    ws_choice, short_rows64 = None, False
    if tile is None and (warp_specialized or (mma is None and by_default_ws and arch in WGMMA_ARCHES and cg % 8 == 0)):
        ws_choice = (default_ws_tile(cg, kg, taps, pixels, fp8_block_k(True) if fp8 else 64,
                                     small_grids_only=fp8 and not warp_specialized)
                     or (("128x128w8", 1) if warp_specialized else None))
        if FP8_ROWS64_BY_DEFAULT and fp8 and taps > 1 and ws_choice and ws_choice[1] > 1 \
                and ws_choice[0] == "128x64w8" and 2 * output_tiles(pixels, kg, 64, 64) >= WS_MIN_CTAS:
            ws_choice = ("64x64w4", 1 if output_tiles(pixels, kg, 64, 64) >= FP8_ROWS64_UNSPLIT_MIN_CTAS else 2)
        short_rows64 = fp8 and block_k is None and cluster is None and short_grid_fp8_rows64(cg, kg, taps, pixels)
        if short_rows64:
            ws_choice = ("64x64w4", 1)
        warp_specialized = ws_choice is not None
        mma = "wgmma_ws" if warp_specialized else mma
    default_tile, default_block_k = default_gemm_tile(cg, kg, taps)
    # 16-byte loads: 8 channels of X; FP8 also 16 e4m3 of W per copy, so W's rows (taps * C/G bytes) must keep
    # 16-byte alignment
    in_vec = 8 if cg % 8 == 0 and not (fp8 and taps * cg % 16) else 1
    if fp8 and in_vec == 1:  # the FP8 gather holds 64 elements of A per thread at BLOCK_M 128: halve the rows
        default_tile = "64x64w4" + ("s2" if default_tile.endswith("s2") else "")
    by_default = FP8_WGMMA_BY_DEFAULT if fp8 else FP16_WGMMA_BY_DEFAULT
    wants_wgmma = (mma in ("wgmma", "wgmma_ws") or (mma is None and by_default)) and arch in WGMMA_ARCHES \
        and in_vec == 8
    choice = (ws_choice or default_wgmma_tile(cg, kg, taps)) if wants_wgmma and tile is None else None
    rows64 = None
    if choice and not fp8 and (warp_specialized or (mma is None and by_default_ws)):
        rows64 = default_rows64_tile(kg, taps, pixels, -(-taps * cg // (64 if cg % 64 == 0 else 32)), choice)
    if rows64:
        choice = ws_choice = rows64
        warp_specialized, mma = True, "wgmma_ws"
    one_warpgroup = (choice == ("128x64w8", 1) and not ws_choice and not fp8 and isinstance(pixels, int)
                     and output_tiles(pixels, kg, 128, 64) >= ONE_WARPGROUP_MIN_CTAS)
    if one_warpgroup:
        choice = ("128x64w4", 1)
    elif (FP8_ROWS256_TAPS_INNER and x_e4m3 and choice == ("128x64w8", 1) and not ws_choice and taps > 1 and cg == 64
          and isinstance(pixels, int) and output_tiles(pixels, kg, 128, 64) >= FP8_TAPS_INNER_MIN_CTAS):
        choice = ("256x64w8", 1)
    if choice:
        (default_tile, default_cluster), default_block_k = choice, None
        cluster = cluster or default_cluster
        if ws_choice and share_w is None and ws_ctas in (None, 1):
            share_w = default_share_w(cluster, pixels)
    elif wants_wgmma and tile is None and not fp8:  # FP8 keeps wgmma: mma.sync e4m3 is emulated on Hopper
        wants_wgmma = False
    name = tile or default_tile
    if name not in GEMM_TILES:
        raise ValueError(f"unknown implicit-GEMM tile {name!r}; pick one of {', '.join(GEMM_TILES)}")
    block_m, block_n, warps_m, warps_n, split = GEMM_TILES[name]
    wgmma = wants_wgmma and wgmma_fits(name)
    ws_tile = warps_m * warps_n == 8 or name in WS_ONLY_TILES + WS_ONE_WARPGROUP_TILES
    if warp_specialized and not (wgmma and ws_tile and split == 1):
        raise ValueError(f"mma='wgmma_ws' takes the 8-warp wgmma tiles without split groups, or "
                         f"{', '.join(WS_ONLY_TILES + WS_ONE_WARPGROUP_TILES)}; {name} is not one")
    if name in WS_ONLY_TILES and not warp_specialized:
        raise ValueError(f"tile {name} runs on the warp-specialized kernel only: give mma='wgmma_ws' (sm_90a)")
    if ws_ctas not in (None, 1, 2) or (ws_ctas == 2 and not (warp_specialized and block_m * block_n <= 128 * 64)):
        raise ValueError(f"ws_ctas={ws_ctas}: 2 blocks per SM take the warp-specialized kernel on tiles of <= 128x64")
    if share_w and not (warp_specialized and (cluster or 1) == 1 and ws_ctas in (None, 1)):
        raise ValueError("share_w pairs the warp-specialized kernel's M tiles in a 2-CTA cluster: give mma='wgmma_ws' "
                         "(or its default) without cluster or ws_ctas")
    if fp8:
        block_k = block_k or (128 if short_rows64 else fp8_block_k(warp_specialized))
    else:
        block_k = block_k or (None if tile else default_block_k) or (64 if in_vec == 8 and cg % 64 == 0 else 32)
    cluster = cluster or 1
    if taps_inner is None and x_e4m3 and wgmma and not warp_specialized and tile is None and cg == block_k \
            and taps > 1 and cluster == 1 and isinstance(pixels, int) \
            and output_tiles(pixels, kg, block_m, block_n) >= FP8_TAPS_INNER_MIN_CTAS:
        taps_inner = True  # FP8_TAPS_INNER_MIN_CTAS
    if cluster > 1 and arch_number(arch) < CLUSTER_ARCH:
        raise ValueError(f"cluster={cluster} needs thread-block clusters (sm_90+); {arch} has none")
    if taps_inner and not (cg % block_k == 0 and taps > 1):
        raise ValueError(f"taps_inner needs C/G ({cg}) a multiple of BLOCK_K ({block_k}) and a filter larger "
                         "than 1x1")
    # FP8 quantizes A one tile ahead of the MMAs; wgmma keeps one more tile's MMAs in flight
    quantize_a = fp8 and in_vec == 8 and not x_e4m3
    min_stages = 2 + quantize_a + wgmma
    k_tiles = -(-taps * cg // block_k)
    k_tiles = -(-k_tiles // (split * cluster))  # reduction tiles per warp group
    depth = max(min_stages, min(stages or (4 if fp8 or block_k == 32 or wgmma else 3), k_tiles + wgmma))
    if warp_specialized:  # the deepest ring that fits (cut below), no deeper than the CTA's tiles need
        depth = max(min_stages, min(stages or (ROWS64_STAGES if rows64 else WS_MAX_STAGES), k_tiles + 1))
    elif wgmma and not fp8 and stages is None and (block_m, block_n, block_k) == (128, 128, 64) and k_tiles == 4 \
            and (pixels is None or output_tiles(pixels, kg, block_m, block_n) >= THREE_STAGE_MIN_CTAS):
        depth = 3  # a 256-deep reduction: 3 stages (96 KB) let two CTAs share an SM, one's epilogue under the other's
                   # loads; 4 (128 KB) held the whole reduction for one (H100 sweep conv-3: 15-22% faster). Only where
                   # the grid outnumbers the SMs (or is not static): else no second CTA comes (~5% slower, lead's run)
    elif one_warpgroup and stages is None:
        depth = 3  # three CTAs an SM (ONE_WARPGROUP_MIN_CTAS)
    config = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, WARPS_M=warps_m, WARPS_N=warps_n,
                  SPLIT_K=split, STAGES=depth, IN_VEC=in_vec, OUT_VEC=_largest_vector(kg))
    if fp8:
        config["FP8"] = 1
    if x_e4m3:
        config["X_E4M3"] = 1
    if wgmma:
        config["WGMMA"] = 1
    if warp_specialized:
        config["WARP_SPECIALIZED"] = 1
    if ws_ctas == 2:
        config["WS_CTAS"] = 2
    if share_w:
        config["SHARE_W"] = 1
    if cluster > 1:
        config["CLUSTER_K"] = cluster
    if taps_inner:
        config["TAPS_INNER"] = 1
    limit = shared_limit(arch) // config.get("WS_CTAS", 1) - 1024 * (config.get("WS_CTAS", 1) - 1)
    while gemm_shared_bytes(config) > limit and config["STAGES"] > min_stages:
        config["STAGES"] -= 1
    if gemm_shared_bytes(config) > limit and tile is None and split > 1:
        return gemm_tile(cg, kg, taps, arch, name.rsplit("s", 1)[0], block_k, stages, fp8, mma, cluster,
                         taps_inner, x_e4m3, share_w=share_w)
    if gemm_shared_bytes(config) > limit:
        raise ValueError(f"implicit-GEMM tile {name} needs {gemm_shared_bytes(config)} bytes of "
                         f"shared memory; {arch} allows {limit}: pick a smaller tile")
    if PUSHED_PAST_RING and cluster > 1 and (warp_specialized or (wgmma and PUSHED_PAST_RING_UNSPECIALIZED)):
        depths = range(config["STAGES"], min(config["STAGES"], max(PUSHED_MIN_STAGES, min_stages)) - 1, -1)
        for depth in depths if warp_specialized else (config["STAGES"],):
            past_ring = {**config, "STAGES": depth}
            past_ring["PUSHED_OFFSET"] = gemm_shared_bytes({**past_ring, "CLUSTER_K": 1}) \
                - (WS_RING_OFFSET if warp_specialized else 0)
            if gemm_shared_bytes(past_ring) <= limit and (warp_specialized or blocks_per_sm(past_ring, arch)
                                                          == blocks_per_sm(config, arch)):
                config = past_ring
                break
    return config


def blocks_per_sm(tile: dict, arch: str) -> int:
    """Thread blocks of an implicit-GEMM tile that the SM's shared memory holds at once (1 KB reserved for each)."""
    return (shared_limit(arch) + 1024) // (gemm_shared_bytes(tile) + 1024)


def gemm_shared_bytes(tile: dict) -> int:
    """Dynamic shared memory of implicit_gemm.cu: every group's pipeline stages (FP8 with 16-byte loads: A staged
    as 2-byte elements, plus a ring of quantized e4m3 A tiles: two, three under wgmma), reused after the main loop
    for the split groups' partial sums (fp32), and then for the staged output tile followed by the partial sums the
    other cluster ranks push for this CTA's rows (implicit_gemm_reduction.cuh; at PUSHED_OFFSET past the ring where
    the warp-specialized kernel has them there)."""
    operand = 1 if tile.get("FP8") else 2
    quantize_a = bool(tile.get("FP8")) and tile["IN_VEC"] == 8 and not tile.get("X_E4M3")
    a_stage = tile["BLOCK_M"] * tile["BLOCK_K"] * (2 if quantize_a else operand)
    b_stage = tile["BLOCK_N"] * tile["BLOCK_K"] * operand
    a8_tiles = (3 if tile.get("WGMMA") else 2) if quantize_a else 0
    group = tile["STAGES"] * (a_stage + b_stage) + a8_tiles * tile["BLOCK_M"] * tile["BLOCK_K"]
    stages = tile["SPLIT_K"] * group
    partials = (tile["SPLIT_K"] - 1) * tile["BLOCK_M"] * tile["BLOCK_N"] * 4
    staged = tile["BLOCK_M"] * (tile["BLOCK_N"] + 8) * 2
    cluster = tile.get("CLUSTER_K", 1)
    owned_blocks = -(-tile["BLOCK_M"] // 16 // cluster)
    pushed = (cluster - 1) * owned_blocks * 16 * tile["BLOCK_N"] * 4
    ring_offset = WS_RING_OFFSET if tile.get("WARP_SPECIALIZED") else 0
    return ring_offset + max(stages, partials, tile.get("PUSHED_OFFSET", staged) + pushed)


def depthwise_tile(c: int, k: int, pixels: int | None = None, chunk_override: int | None = None) -> dict:
    """Depthwise block: CHUNKS channel chunks of DW_VEC channels, DW_PIX pixels a thread. Up to 8 chunks (32 without
    vectors), as few as cover the channels; where that leaves a block of the last column part-empty (144 channels = 18
    chunks of 8 on blocks of 8: a quarter of the threads idle), the largest power of two >= 2 that divides the chunk
    count. ``pixels``: DW_PIX (1, 2 or 4; the plan's default: ``depthwise_pixels``); ``chunk_override``: CHUNKS (1-256,
    need not divide 256: the block then leaves 256 % CHUNKS threads without a pixel), e.g. every chunk of the
    channels in one block so that a warp's loads cover whole pixels."""
    mult = k // c
    vec = _largest_vector(c) if mult == 1 else 1
    groups_of_vec = -(-k // vec)
    chunks = min(8 if vec > 1 else 32, 1 << max(0, groups_of_vec - 1).bit_length())
    dividing = max(d for d in (1, 2, 4, 8, 16, 32) if d <= chunks and groups_of_vec % d == 0)
    if pixels not in (None, 1, 2, 4):
        raise ValueError(f"dw_pixels={pixels}: a depthwise thread computes 1, 2 or 4 pixels")
    if chunk_override is not None and not 1 <= chunk_override <= 256:
        raise ValueError(f"dw_chunks={chunk_override}: a depthwise block has 1 to 256 channel chunks")
    return dict(CH_MULT=mult, DW_VEC=vec, CHUNKS=chunk_override or (dividing if dividing >= 2 else chunks),
                DW_PIX=pixels or 1)


def depthwise_pixels(tile: dict, geo: dict, pixels) -> int:
    """DW_PIX of the default depthwise plan: DEPTHWISE_PIXELS for stride-1 filters where the static output (``pixels``
    = N*P*Q, an int) keeps >= SM_COUNT blocks at that count, else 1."""
    blocks = lambda per_thread: (-(-pixels // (256 // tile["CHUNKS"] * per_thread))  # noqa: E731
                                 * -(-geo["K"] // (tile["CHUNKS"] * tile["DW_VEC"])))
    stride_one = tuple(geo["strides"]) == (1, 1)
    return DEPTHWISE_PIXELS if stride_one and isinstance(pixels, int) and blocks(DEPTHWISE_PIXELS) >= SM_COUNT else 1


def depthwise_whole_pixels(tile: dict, geo: dict, pixels) -> dict | None:
    """The default depthwise block with every channel chunk in it and DEPTHWISE_PIXELS pixels a thread, for a stride-2
    filter whose ``tile`` reads fewer than DW_WHOLE_PIXEL_BYTES of each pixel (2-byte X) on a static output (``pixels``
    = N*P*Q, an int) that makes >= DW_WHOLE_PIXEL_MIN_WAVES waves of SM_COUNT such blocks; else None."""
    chunks = -(-geo["K"] // tile["DW_VEC"])
    if tuple(geo["strides"]) != (2, 2) or not isinstance(pixels, int) or tile["CH_MULT"] != 1 \
            or 2 * tile["CHUNKS"] * tile["DW_VEC"] >= DW_WHOLE_PIXEL_BYTES or chunks > 256:
        return None
    whole = {**tile, "CHUNKS": chunks, "DW_PIX": DEPTHWISE_PIXELS}
    return whole if -(-pixels // (256 // chunks * DEPTHWISE_PIXELS)) >= DW_WHOLE_PIXEL_MIN_WAVES * SM_COUNT else None


def output_shape_conv(input_shapes, attrs) -> tuple:
    """Y's shape: [N, K, P, Q] (1-D: [N, K, Q]); ints or symbolic dims, ``+ - * //`` only."""
    geo = conv_geometry(input_shapes[0], input_shapes[1], attrs)
    return (geo["N"], geo["K"], geo["P"], geo["Q"]) if len(input_shapes[0]) == 4 else (geo["N"], geo["K"], geo["Q"])


def check_formats(formats, dtypes, geo: dict) -> int:
    """TensorRT's formats (X, W, shift, scale, residual, Y; with the dtypes of X, residual and Y) -> X's pixel
    stride. The kernels read NHWC: ``HWC8`` (16-bit) and ``HWC16`` (e4m3) are NHWC with channels padded to a
    multiple of 8 / 16, which the kernels skip for X (its pixel stride is a scalar argument) but not for the
    residual and Y (an FP8 producer's e4m3 Y in HWC16: K % 16 == 0)."""
    x_dtype, residual_dtype, y_dtype = dtypes
    tensors = (("X", formats[0], geo["C"], x_dtype), ("residual", formats[4], geo["K"], residual_dtype),
               ("Y", formats[5], geo["K"], y_dtype))
    for name, fmt, channels, dtype in tensors:
        if fmt is None:
            continue
        wanted, multiple = CHANNELS_LAST_FORMATS.get(dtype, ("HWC8", 8))
        if fmt != wanted:
            raise ValueError(f"FusedConv reads {name} ({dtype}) channels-last; TensorRT offered {fmt} "
                             f"(ask for {wanted})")
        if name != "X" and channels % multiple:
            raise ValueError(f"FusedConv {name} has {channels} channels: {wanted} pads them to a multiple of "
                             f"{multiple}, which the kernels write and read unpadded (give the layer "
                             f"{multiple}k output channels)")
    if formats[0] is None:
        return geo["C"]
    multiple = CHANNELS_LAST_FORMATS.get(x_dtype, ("HWC8", 8))[1]
    return -(-geo["C"] // multiple) * multiple


def check_fp8(x_dtype, w_dtype, input_scale: float, arch: str) -> None:
    """FP8 FusedConv: float16/bfloat16 X (quantized in the kernel) or float8_e4m3fn X (already quantized by its
    producer), float8_e4m3fn W, a positive finite input_scale, e4m3 tensor cores."""
    if x_dtype not in (*ELEMENT_DTYPES, "float8_e4m3fn") or w_dtype != "float8_e4m3fn":
        raise ValueError(f"FP8 FusedConv (input_scale != 0) takes float16, bfloat16 or float8_e4m3fn X with "
                         f"float8_e4m3fn W; got X {x_dtype}, W {w_dtype} (quantize W to e4m3, or set input_scale 0)")
    if not (math.isfinite(input_scale) and input_scale > 0):
        raise ValueError(f"input_scale must be a positive finite number (0 disables FP8); got {input_scale}")
    if arch_number(arch) < 89:
        raise ValueError(f"FP8 FusedConv needs e4m3 tensor cores (sm_89 or newer: Ada, Hopper); {arch} has none: "
                         "run the layer in float16/bfloat16 (input_scale 0)")


def float_dtype_conv(input_dtypes) -> str:
    """The dtype the epilogue computes y in and reads the residual in: X's, float16 when X is float8_e4m3fn."""
    return "float16" if input_dtypes[0] == "float8_e4m3fn" else input_dtypes[0]


def output_dtype_conv(input_dtypes, attrs=None) -> str:
    """Y's dtype (the contract): float8_e4m3fn with ``output_scale``, else the epilogue's (``float_dtype_conv``)."""
    return "float8_e4m3fn" if attrs and attrs.get("output_scale") else float_dtype_conv(input_dtypes)


def check_output_scale(output_scale: float, arch: str) -> None:
    """An FP8 output (``output_scale`` != 0): a positive finite scale, and e4m3 conversion in hardware."""
    if not (math.isfinite(output_scale) and output_scale > 0):
        raise ValueError(f"output_scale must be a positive finite number (0 writes Y unquantized); got {output_scale}")
    if arch_number(arch) < 89:
        raise ValueError(f"FusedConv with output_scale writes e4m3 for FP8 consumers (sm_89 or newer); {arch} has "
                         "none: set output_scale 0")


def plan_conv(input_shapes, input_dtypes, attrs, arch: str, *, formats=None, tile: str | None = None,
              block_k: int | None = None, stages: int | None = None, mma: str | None = None,
              cluster: int | None = None, taps_inner: bool | None = None, ws_ctas: int | None = None,
              share_w: bool | None = None, tap_rows: bool | None = None, dw_pixels: int | None = None,
              dw_chunks: int | None = None) -> LaunchPlan:
    """The FusedConv launch (kernel arguments: ``X, W, shift?, scale?, residual?``, then int32
    ``N, H, W, C, K, P, Q, pad_h, pad_w, x_stride``, then ``Y``; ``x_stride`` is X's pixel stride: C, or C padded
    to 8 / 16 in TensorRT's HWC8 / HWC16). ``formats``: TensorRT's tensor formats (contract inputs, then Y; None
    from the direct launcher, whose arrays are checked dense channels-last by the API).
    ``tile``/``block_k``/``stages``/``mma``/``cluster``/``taps_inner``/``ws_ctas``/``share_w``: implicit-GEMM
    overrides (a ``GEMM_TILES`` name, BLOCK_K, pipeline depth, main loop, cluster split of the reduction, reduction
    order, warp-specialized blocks per SM, W tiles shared by M-tile pairs), for tuning only: see ``gemm_tile``;
    ``tap_rows``: the tap-row gather on or off (default: where ``tap_rows_fit`` and the row fills over half a tile);
    ``dw_pixels``, ``dw_chunks``: output pixels per depthwise thread, channel chunks per block (``depthwise_tile``)."""
    x_shape, w_shape, shift_shape, scale_shape, residual_shape = (list(input_shapes) + [None] * 5)[:5]
    x_dtype, w_dtype = input_dtypes[0], input_dtypes[1]
    input_scale = float(attrs["input_scale"])
    fp8 = input_scale != 0.0
    if fp8:
        check_fp8(x_dtype, w_dtype, input_scale, arch)
    elif "float8_e4m3fn" in (x_dtype, w_dtype):
        raise ValueError("float8_e4m3fn X or W is FP8 FusedConv: give input_scale (the per-tensor scale of X, > 0)")
    elif x_dtype not in ELEMENT_DTYPES or w_dtype != x_dtype:
        raise ValueError(f"FusedConv kernels take float16 or bfloat16 X with W of the same dtype; got X {x_dtype}, "
                         f"W {w_dtype} (cast float32 models to float16/bfloat16)")
    for name, shape, dtype in (("shift", shift_shape, input_dtypes[2:3]), ("scale", scale_shape, input_dtypes[3:4])):
        if shape is not None and (list(dtype) != ["float32"] or len(shape) != 1):
            raise ValueError(f"{name} must be float32 [K]; got {dtype[0] if dtype else None} {tuple(shape)}")
    output_scale = float(attrs.get("output_scale", 0.0))
    if output_scale:
        check_output_scale(output_scale, arch)
    float_dtype, y_dtype = float_dtype_conv(input_dtypes), output_dtype_conv(input_dtypes, attrs)
    if residual_shape is not None and input_dtypes[4] != float_dtype:
        raise ValueError(f"residual must have the dtype the output is computed in, {float_dtype}; got "
                         f"{input_dtypes[4]}")
    geo = conv_geometry(x_shape, w_shape, attrs)
    x_stride = geo["C"] if formats is None else check_formats(formats, (x_dtype, float_dtype, y_dtype), geo)
    for name, shape in (("shift", shift_shape), ("scale", scale_shape)):
        if shape is not None and isinstance(shape[0], int) and shape[0] != geo["K"]:
            raise ValueError(f"{name} has {shape[0]} entries; W has K={geo['K']} output channels")

    defines = {"DTYPE_BF16": int(float_dtype == "bfloat16"), "KH": geo["KH"], "KW": geo["KW"],
               "STRIDE_H": geo["strides"][0], "STRIDE_W": geo["strides"][1],
               "DIL_H": geo["dilations"][0], "DIL_W": geo["dilations"][1],
               **epilogue_defines(attrs, shift_shape is not None, scale_shape is not None,
                                  residual_shape is not None)}
    scalars = (geo["N"], geo["H"], geo["W"], geo["C"], geo["K"], geo["P"], geo["Q"], geo["pads"][0], geo["pads"][1],
               x_stride)
    pixels = geo["N"] * geo["P"] * geo["Q"]
    x_e4m3 = x_dtype == "float8_e4m3fn"
    if fp8:
        defines.update(FP8=1, INPUT_SCALE=float_literal(input_scale),
                       INPUT_SCALE_INV=float_literal(1.0 / input_scale))
    if output_scale:
        defines.update(OUTPUT_E4M3=1, OUTPUT_SCALE_INV=float_literal(1.0 / output_scale))
    if x_e4m3 and geo["Cg"] % 16:
        raise ValueError(f"float8_e4m3fn X moves 16 channels per load: C/G = {geo['Cg']} is not a multiple of 16 "
                         "(give X in float16/bfloat16 for this layer)")
    if geo["Cg"] == 1 and geo["G"] > 1:
        if fp8:
            raise ValueError("FP8 FusedConv has no depthwise kernel (group == C); run depthwise layers in "
                             "float16/bfloat16 (input_scale 0)")
        dw = depthwise_tile(geo["C"], geo["K"], dw_pixels, dw_chunks)
        if dw_pixels is None:
            dw["DW_PIX"] = depthwise_pixels(dw, geo, pixels)
        if dw_pixels is None and dw_chunks is None:
            dw = depthwise_whole_pixels(dw, geo, pixels) or dw
        block_pixels, block_channels = 256 // dw["CHUNKS"] * dw["DW_PIX"], dw["CHUNKS"] * dw["DW_VEC"]
        return LaunchPlan(source=DEPTHWISE, kernel="fused_conv_depthwise", defines={**defines, **dw},
                          grid=((pixels + block_pixels - 1) // block_pixels,
                                (geo["K"] + block_channels - 1) // block_channels, 1),
                          block=(256, 1, 1), shared_mem=0, scalars=scalars)
    config = gemm_tile(geo["Cg"], geo["Kg"], geo["KH"] * geo["KW"], arch, tile, block_k, stages, fp8, mma, cluster,
                       taps_inner, x_e4m3, pixels if isinstance(pixels, int) else None, ws_ctas, share_w)
    fits = tap_rows_fit(config, geo, fp8)
    if tap_rows and not fits:
        raise ValueError("tap_rows needs the element gather (C/G % 8 != 0) in float16/bfloat16, one group, undilated "
                         "filter rows of KW * C/G <= 32 over a filter taller than 1, and a tile with BLOCK_K 32 and a "
                         "thread per A row (e.g. 128x64w4)")
    if tap_rows or (tap_rows is None and fits and TAP_ROWS_BY_DEFAULT and 2 * geo["KW"] * geo["Cg"] > 32):
        ctas = output_tiles(pixels, geo["Kg"], config["BLOCK_M"], config["BLOCK_N"]) * geo["G"] \
            if isinstance(pixels, int) else None
        blocks = tap_rows_blocks(ctas, arch)
        config.update(TAP_ROWS=1, TAP_CG=geo["Cg"], TAP_ROWS_BLOCKS=blocks)
        if blocks == 4 and stages is None:
            config["STAGES"] = 3
    ws = bool(config.get("WARP_SPECIALIZED"))
    m_tiles = (pixels + config["BLOCK_M"] - 1) // config["BLOCK_M"]
    return LaunchPlan(source=IMPLICIT_GEMM_SM90 if ws else IMPLICIT_GEMM,
                      kernel="fused_conv_implicit_gemm_sm90" if ws else "fused_conv_implicit_gemm",
                      defines={**defines, "GROUPS": geo["G"], **config},
                      grid=((m_tiles + 1) // 2 * 2 if config.get("SHARE_W") else m_tiles,  # SHARE_W: whole pairs
                            (geo["Kg"] + config["BLOCK_N"] - 1) // config["BLOCK_N"],
                            geo["G"] * config.get("CLUSTER_K", 1)),
                      block=(config["WARPS_M"] * config["WARPS_N"] * config["SPLIT_K"] * 32
                             + WS_LOAD_THREADS * ws, 1, 1),
                      shared_mem=gemm_shared_bytes(config), scalars=scalars)
