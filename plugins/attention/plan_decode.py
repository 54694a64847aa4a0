"""``plan_decode``: the decode part of FusedAttention's launch plan (few queries against many keys): whether the query
heads of a K/V head share a tile (GQA packing, ``PACK_GQA``), the tile that holds those rows, and over how many key
groups of warps in a block (``WARP_SPLIT``) and CTAs of a thread-block cluster (``KV_SPLIT``) the keys are split
(attention_split_kv.cuh).

A static choice, from what a TensorRT build knows: packing needs the query length and both head counts as plain ints
(the tile's rows are query length x group); the split also needs the batch and the key length (how many CTAs the
grid has and how many key tiles each would get). Dynamic dimensions fall back to the general plan. Measurements
behind the numbers: NOTES.md, "Decode".
"""
from __future__ import annotations

from typing import NamedTuple

from trt_fusedattn.launcher.arch import CLUSTER_ARCH, WGMMA_ARCHES, arch_number

# Decode tiles on the mma.sync mainloop, by the packed rows they hold: (max rows, (BLOCK_M, BLOCK_N, NUM_WARPS,
# Q_IN_REGISTERS, KV_STAGES), WARP_SPLIT, blocks an SM). 16 rows per warp; the warps of a block form WARP_SPLIT key
# groups, each streaming its own share of the keys through its own two K/V stages, combined in shared memory; within
# a group every warp reads the same K/V tile, so a K/V head is read once. 64 rows: four key groups of four warps
# (16 warps, 128 registers, one block an SM; each group's partials over its own stages): twice the warps and the
# bytes in flight of two groups of 64x32 (run 6: 59-77% of the read on 32k/128k keys x batch 1/4, was 54-56%).
DECODE_TILES = ((16, (16, 16, 4, 0, 2), 4, 3), (32, (32, 32, 4, 0, 2), 2, 2), (64, (64, 32, 16, 0, 2), 4, 1),
                (128, (128, 64, 8, 0, 2), 1, 1))
# Grids that stay below SPLIT_TARGET_CTAS CTAs even split (batch 1 x 8 K/V heads): 16 rows take 32-key tiles in
# their four groups (one 144 KB block an SM, more bytes in flight per block): 15-20% faster there in runs 2-3, while
# on fuller grids 16-key tiles were as fast or up to 19% faster (NOTES.md).
DECODE_TILES_SMALL_GRID = {16: ((16, 32, 4, 0, 2), 4, 1)}
# Grids of FULL_GRID_CTAS CTAs and more without a split (two blocks on each SM): 64 rows take one group of four warps
# streaming 64-key tiles (87 KB, two blocks an SM): run 6's variant column, 2-10% faster than the 16-warp tile at
# 16 queries x 1k-4k keys x batch 32-128 (no keys split over groups to combine), 15% slower at 128 CTAs.
DECODE_TILES_FULL_GRID = {64: ((64, 64, 4, 0, 2), 1, 2)}
FULL_GRID_CTAS = 256
DECODE_MAX_QUERIES = 16       # longer query blocks fill tiles without packing (prefill, chunked prefill)
DECODE_MAX_HEAD_DIM = 128     # padded Q/K and V head dims the 16-rows-per-warp tiles hold without spills
# The cluster split: the smallest of SPLITS that gives the grid SPLIT_TARGET_CTAS CTAs (about one per SM of a 132-SM
# H100: each holds 4-8 warps; splitting grids that already fill the GPU lost in runs 1-2, NOTES.md), as long as each
# part (CTA x key group) keeps SPLIT_MIN_KEYS keys (4k keys over 8 CTAs x 4 groups still gained in run 2).
SPLITS = (1, 2, 4, 8)
SPLIT_TARGET_CTAS = 128
SPLIT_MIN_KEYS = 128
# CTAs of a one-block-an-SM tile that a 132-SM H100/H200 runs at once in clusters of 4 or 8 CTAs (ncu, run 5: "Max
# Active Clusters" 30 of 4, 15 of 8: a cluster needs that many free SMs in one GPC). A grid of 128 such CTAs ran its
# last clusters in a second wave (16 queries x 32k keys x batch 4 took 1.8x its one-wave time), so such a grid takes
# the next smaller split instead.
ONE_PER_SM_CLUSTER_CTAS = 120
# On sm_90a at these head dims (Q/K and V alike), decode tiles of <= 64 packed rows run on the wgmma mainloop
# (attention_decode_sm90.cuh): each key group is one 64-row warpgroup whose wgmmas read every K/V tile once for all its
# rows (~1.5 bytes of shared-memory reads per K/V byte against ~5 for 16-row mma.sync warps, whose shared memory bound
# the 16-query small grids). Session 4's runs 1-2 (H100, NOTES.md):
# - 64 rows on grids that split: two groups of 64-key tiles (145 KB, one block an SM) read K/V at 78-96% of the device
#   read where the mma.sync tiles read 57-77% (three groups: 2-4% faster on 16k+ keys a CTA, 4% slower below);
# - grids that need no split (>= SPLIT_TARGET_CTAS CTAs), any <= 64 packed rows: one group, of 64-key tiles (80 KB, two blocks
#   an SM) from FULL_GRID_CTAS CTAs, 5-9% faster than the mma.sync tiles (1-4 queries too: 1.02-1.03x cuDNN at one
#   query), of 128-key tiles (145 KB) below that, 6% faster at 128 CTAs;
# - <= 32 rows on grids that split stay on the mma.sync tiles (the wgmma ones were equal or slower there).
# Head dim 64 takes the same tiles since v5 (session 5 run 1, `--head-dim 64`: every shape faster than its mma.sync
# tile, e.g. 16 x 32k x 4 0.1110 ms vs 0.1488 with three groups, 1 x 32k x 16 0.3636 vs 0.4373 with one group of
# 128-key tiles).
DECODE_TILES_WGMMA = {64: ((64, 64, 8, 0, 2), 2, 1)}
DECODE_TILES_WGMMA_NO_SPLIT = ((FULL_GRID_CTAS, (64, 64, 4, 0, 2), 1, 2), (SPLIT_TARGET_CTAS, (64, 128, 4, 0, 2), 1, 1))
WGMMA_DECODE_HEAD_DIMS = (64, 128)
# v5: on grids that split, the wgmma tile of <= 64 packed rows (1-16 queries of GQA 32/8) is chosen by the grid after the
# split (session 5 run 1, H100, variant columns at the plan's split; KV_STAGES 3: a ring of three K/V tile pairs a key
# group, two in flight while one is computed):
# (only where each CTA's part of the keys keeps >= V5_MIN_PART_KEYS keys: below that, e.g. 4k keys over 8 CTAs or 1k
# over 4, L2-resident K/V, the v4.1 tiles stay: the 3-stage pair lost 9% at 1 x 4k x 1, three groups 22% at 16 x 1k x 1)
# - clusters of SPLITS[-1] (8) CTAs on grids of <= ONE_PER_SM_CLUSTER_CTAS (batch 1 x 8 K/V heads: 64 CTAs, each alone
#   on its SM, must pull twice its share of the read): two groups of 64-key tiles x three stages (214 KB), 5-6% faster than v4.1 at 1, 4 and 16 queries
#   (16 x 32k x 1 0.0522 ms vs 0.0553, 85% of the read; 1 x 32k x 1 0.0512 vs mma.sync 0.0540, 1.01x cuDNN; 1 x 128k x 1
#   0.1789 vs 0.1900);
# - grids of >= SPLIT_TARGET_CTAS CTAs after the split: one group of 64-key tiles x three stages (115,696 B: two blocks
#   an SM), 2-4% faster at 4k keys x batch 8 (1 x 4k x 8 0.0502 vs 0.0510), equal at 32k/128k x batch 4;
# - fewer CTAs on smaller clusters (16 queries x 32k/128k x batch 4: 64 CTAs of a 2-CTA cluster): three groups of
#   64-key tiles x two stages, 2-5% faster than two groups (0.1841 vs 0.1883 ms; 0.7010 vs 0.7348).
V5_MIN_PART_KEYS = 2048
WGMMA_SPLIT8_TILE = ((64, 64, 8, 0, 3), 2, 1)
WGMMA_SPLIT_FULL_TILE = ((64, 64, 4, 0, 3), 1, 2)
WGMMA_SPLIT_FEW_CTAS_TILE = ((64, 64, 12, 0, 2), 3, 1)
# v6, head dim 64 (session 7 run 1, H100, candidate columns; NOTES.md): where v5's split tiles apply, the split is the
# largest whose grid stays <= V6_MAX_CTAS CTAs with parts of >= V5_MIN_PART_KEYS keys, and the tile follows the grid:
# - 64 CTAs (batch 1 x 8 K/V heads in clusters of 8): <= 16 rows on the 16-row mma.sync tile of four one-warp key
#   groups x 32-key tiles x three stages (1 x 32k x 1 0.0292 ms = 0.99x cuDNN, v5 0.0339: a 64-row warpgroup spends its
#   softmax on 60 empty rows, which at head dim 64 weighs twice per K/V byte what it does at 128), more rows on two
#   groups of 128-key tiles x three stages (128 KB in flight a CTA; 16 x 32k x 1 0.0318 vs 0.0354);
# - 128 CTAs: one group of 128-key tiles x three stages (107,504 B, two an SM; 1 x 4k x 8 0.0270 vs 0.0280);
# - 256 CTAs: one group of 64-key tiles x three stages (58,352 B: three an SM, so 256 CTAs in clusters of 8 run in one
#   wave; 1 x 32k x 4 0.0963 vs 0.1090, 16 x 32k x 4 0.0980 vs 0.1095).
# Head dim 128 keeps v5: no candidate beat it by more than 1% (its tiles are twice the bytes a key).
V6_HEAD_DIMS = (64,)
V6_MAX_CTAS = 256
V6_SPLIT_TILES = {64: ((16, (16, 32, 4, 0, 3), 4, 1, 0), (64, (64, 128, 8, 0, 3), 2, 1, 1)),
                  128: ((64, (64, 128, 4, 0, 3), 1, 2, 1),), 256: ((64, (64, 64, 4, 0, 3), 1, 3, 1),)}
# v7 (session 8), head dims 128 and 64: where the split is V7_SPLIT (batch 4 x 8 K/V heads: 64 CTAs in clusters of 2)
# and each CTA keeps >= V7_MIN_PART_KEYS keys, three wgmma groups x two stages (one block an SM; V7_TILES) instead of
# v5's one group x three stages on 128 CTAs (split 4; head dim 128) or v6's one group of 64-key tiles on 256 CTAs (split
# 8, three an SM; head dim 64). Head dim 128, H200 (session 7's end): 1 / 4 x 32k x 4 0.1475 / 0.1474 ms vs 0.1588 /
# 0.1579, 128k x 4 -8..-10%; H100 (session 8 runs 1-2, v6 beside): 32k x 4 0.1822 / 0.1834 vs 0.1911 / 0.1926, 128k x 4
# 0.6961 / 0.6949 vs 0.7461 / 0.7456. The same tile at split 8 (batch 1, 128k keys) gained 5-7% on the H200 and lost
# 2.5-3.9% on the H100 (0.1817 vs 0.1768 at one query): not taken there. Head dim 64 (session 8 run 3, H100): 128-key
# tiles, 1 / 4 / 16 x 32k x 4 0.0971 / 0.0977 / 0.0993 vs v6's 0.1065 / 0.1067 / 0.1082, 128k x 4 0.3654 / 0.3619 / 0.3625
# vs 0.4044 / 0.4035 / 0.4072 (session 7's same column at 32k x 4: 0.0987-0.0999, v6's tile there 0.096-0.108 by run).
V7_HEAD_DIMS = (64, 128)
V7_CTAS = 64
V7_SPLIT = 2
V7_MIN_PART_KEYS = 16384
V7_TILES = {128: WGMMA_SPLIT_FEW_CTAS_TILE, 64: ((64, 128, 12, 0, 2), 3, 1)}
# v7, head dim 64: on the 128-CTA grid of v6 (4k keys x batch 8, split 2), <= 16 packed rows take the 16-row mma.sync
# tile of four one-warp key groups x 32-key tiles x five stages (186,624 B: one block an SM; four 8 KB tile pairs in
# flight a group): session 8 run 1, 1 / 4 x 4k x 8 0.0273 / 0.0278 ms vs v6's one wgmma group of 128-key tiles x three
# stages 0.0289 / 0.0291 (six stages the same, three stages with Q in registers 0.0279 / 0.0283). One block an SM: only
# where every cluster of the grid fits at once (ONE_PER_SM_CLUSTER_CTAS), i.e. clusters of 2.
V7_MMA16_HEAD_DIMS = (64,)
V7_MMA16_SPLIT_TILES = {128: ((16, (16, 32, 4, 0, 5), 4, 1, 0),)}


class DecodeChoice(NamedTuple):
    tile: tuple       # (BLOCK_M, BLOCK_N, NUM_WARPS, Q_IN_REGISTERS, KV_STAGES)
    pack: int         # PACK_GQA: query heads per tile row group (1: no packing)
    split: int        # KV_SPLIT: CTAs of a cluster sharing the keys (1: no split)
    warp_split: int   # WARP_SPLIT: key groups of warps in a block
    wgmma: int = 0    # WGMMA: the tile runs on the wgmma mainloop (sm_90a; a key group is one 64-row warpgroup)


def _static(*dims) -> bool:
    return all(isinstance(d, int) for d in dims)


def decode_split(ctas: int, len_kv: int, warp_split: int, arch: str, blocks_per_sm: int = 2) -> int:
    """KV_SPLIT for a grid of ``ctas`` CTAs (without the split) whose rows attend ``len_kv`` keys, each CTA's keys
    already split over ``warp_split`` key groups, ``blocks_per_sm`` of them fitting on an SM."""
    if arch_number(arch) < CLUSTER_ARCH:
        return 1
    split = next((s for s in SPLITS if ctas * s >= SPLIT_TARGET_CTAS or len_kv < SPLIT_MIN_KEYS * warp_split * s * 2),
                 SPLITS[-1])
    if blocks_per_sm == 1 and split >= 4 and ctas * split > ONE_PER_SM_CLUSTER_CTAS:
        split //= 2
    return split


def combine_bytes(block_m: int, block_n: int, stages: int, dim: int, dim_v: int, key_groups: int, split: int,
                  wgmma: bool = False) -> int:
    """Shared memory the split/key-group combine adds after the K/V stages (attention_split_kv.cuh): none without a
    split or key groups, and none where a key group's partials (fp32 O of ``block_m`` rows of the padded D_v, and a
    reference and a sum per row) fit over its own K/V stages (rows padded for ldmatrix on mma.sync, unpadded swizzled
    rows on wgmma); else every group's partials."""
    if split == 1 and key_groups == 1:
        return 0
    pitch_qk, pitch_v = (dim, dim_v) if wgmma else (-(-d // 16) * 16 + 8 for d in (dim, dim_v))
    partials = 4 * block_m * (-(-dim_v // 16) * 16 + 2)
    return 0 if partials <= 2 * stages * block_n * (pitch_qk + pitch_v) else key_groups * partials


def wgmma_split_tile(rows: int, ctas: int, split: int, len_kv: int):
    """v5's wgmma decode tile (tile, key groups, blocks an SM) for ``rows`` packed rows on a grid of ``ctas`` CTAs split
    over clusters of ``split``, or None where the v4.1 tiles stay."""
    if len_kv < V5_MIN_PART_KEYS * split:
        return None
    if split == SPLITS[-1]:  # (one block an SM: only grids a wave of 8-CTA clusters holds; larger ones are untimed)
        return WGMMA_SPLIT8_TILE if ctas * split <= ONE_PER_SM_CLUSTER_CTAS else None
    if ctas * split >= SPLIT_TARGET_CTAS:
        return WGMMA_SPLIT_FULL_TILE
    return WGMMA_SPLIT_FEW_CTAS_TILE if rows > 16 else None


def v6_split_choice(rows: int, ctas: int, len_kv: int, v7: bool = False):
    """v6's head-dim-64 split (split, tile, key groups, blocks an SM, wgmma) for ``rows`` packed rows on a grid of
    ``ctas`` CTAs before the split, or None where no split keeps parts of V5_MIN_PART_KEYS keys; ``v7``: v7's 16-row
    tile first where it applies (a one-block-an-SM tile only where all its clusters fit at once)."""
    split = next((s for s in reversed(SPLITS) if s > 1 and ctas * s <= V6_MAX_CTAS and len_kv >= V5_MIN_PART_KEYS * s),
                 None)
    grid = ctas * split if split else 0
    tiles = (V7_MMA16_SPLIT_TILES.get(grid, ()) if v7 else ()) + V6_SPLIT_TILES.get(grid, ())
    choice = next(((t, w, b, g) for max_rows, t, w, b, g in tiles
                   if rows <= max_rows and not (b == 1 and split >= 4 and grid > ONE_PER_SM_CLUSTER_CTAS)), None)
    return (split, *choice) if choice else None


def v7_split_choice(ctas: int, len_kv: int, dim: int):
    """v7's choice (split, tile, key groups, blocks an SM, wgmma) for a grid of ``ctas`` CTAs before the split at head
    dim ``dim``, or None where no V7_SPLIT-fold split gives V7_CTAS CTAs of >= V7_MIN_PART_KEYS keys each."""
    if dim not in V7_HEAD_DIMS or ctas * V7_SPLIT != V7_CTAS or len_kv < V7_MIN_PART_KEYS * V7_SPLIT:
        return None
    return (V7_SPLIT, *V7_TILES[dim], 1)


def plan_decode(batch, len_q, len_kv, heads_q, heads_kv, dim: int, dim_v: int, arch: str) -> DecodeChoice | None:
    """The decode plan for these dimensions, or None when the shape is not decode (or not static enough to know)."""
    if not _static(len_q, heads_q, heads_kv) or len_q > DECODE_MAX_QUERIES:
        return None
    if max(-(-dim // 16), -(-dim_v // 16)) * 16 > DECODE_MAX_HEAD_DIM:
        return None
    pack = heads_q // heads_kv
    rows = len_q * pack
    tile, warp_split, per_sm = next(((t, w, b) for max_rows, t, w, b in DECODE_TILES if rows <= max_rows),
                                    (None, 1, 1))
    if tile is None:
        return None
    wgmma_ok = arch in WGMMA_ARCHES and dim == dim_v and dim in WGMMA_DECODE_HEAD_DIMS
    wgmma = int(wgmma_ok and tile[0] in DECODE_TILES_WGMMA)
    if wgmma:
        tile, warp_split, per_sm = DECODE_TILES_WGMMA[tile[0]]
    split = 1
    if _static(batch, len_kv):
        ctas = -(-rows // tile[0]) * heads_kv * batch
        no_split = next(((t, w, b) for least, t, w, b in DECODE_TILES_WGMMA_NO_SPLIT if ctas >= least), None)
        if wgmma_ok and pack > 1 and tile[0] <= 64 and no_split:
            (tile, warp_split, per_sm), wgmma = no_split, 1
        else:
            split = decode_split(ctas, len_kv, warp_split, arch, per_sm)
            other = (DECODE_TILES_SMALL_GRID if ctas * split < SPLIT_TARGET_CTAS
                     else DECODE_TILES_FULL_GRID if ctas >= FULL_GRID_CTAS else {}).get(tile[0])
            if other:
                tile, warp_split, per_sm = other
                split = decode_split(ctas, len_kv, warp_split, arch, per_sm)
            v5 = wgmma_ok and pack > 1 and rows <= 64 and split > 1 and wgmma_split_tile(rows, ctas, split, len_kv)
            v6 = v5 and dim in V6_HEAD_DIMS and v6_split_choice(rows, ctas, len_kv, dim in V7_MMA16_HEAD_DIMS)
            v7 = v5 and v7_split_choice(ctas, len_kv, dim)
            if v7 or v6:
                split, tile, warp_split, per_sm, wgmma = v7 or v6
            elif v5:
                (tile, warp_split, per_sm), wgmma = v5, 1
    if pack == 1 and split == 1 and not wgmma:
        return None  # nothing decode-specific: the general tiles serve it
    return DecodeChoice(tile, pack, split, warp_split, wgmma)
