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

from trt_fusedattn.launcher.arch import CLUSTER_ARCH, arch_number

# Decode tiles on the mma.sync mainloop, by the packed rows they hold: (max rows, (BLOCK_M, BLOCK_N, NUM_WARPS,
# Q_IN_REGISTERS, KV_STAGES), WARP_SPLIT). 16 rows per warp; the warps of a block form WARP_SPLIT key groups, each
# streaming its own share of the keys through its own two K/V stages (small tiles keep 3 blocks of 4-8 warps on an
# SM), combined in shared memory; within a group every warp reads the same K/V tile, so a K/V head is read once.
DECODE_TILES = ((16, (16, 16, 4, 0, 2), 4), (32, (32, 32, 4, 0, 2), 2), (64, (64, 32, 8, 0, 2), 2),
                (128, (128, 64, 8, 0, 2), 1))
# Grids that stay below SPLIT_TARGET_CTAS CTAs even split (batch 1 x 8 K/V heads): 16 rows take 32-key tiles in
# their four groups (one 177 KB block an SM, more bytes in flight per block): 15-20% faster there in runs 2-3, while
# on fuller grids 16-key tiles were as fast or up to 19% faster (NOTES.md).
DECODE_TILES_SMALL_GRID = {16: (16, 32, 4, 0, 2)}
DECODE_MAX_QUERIES = 16       # longer query blocks fill tiles without packing (prefill, chunked prefill)
DECODE_MAX_HEAD_DIM = 128     # padded Q/K and V head dims the 16-rows-per-warp tiles hold without spills
# The cluster split: the smallest of SPLITS that gives the grid SPLIT_TARGET_CTAS CTAs (about one per SM of a 132-SM
# H100: each holds 4-8 warps; splitting grids that already fill the GPU lost in runs 1-2, NOTES.md), as long as each
# part (CTA x key group) keeps SPLIT_MIN_KEYS keys (4k keys over 8 CTAs x 4 groups still gained in run 2).
SPLITS = (1, 2, 4, 8)
SPLIT_TARGET_CTAS = 128
SPLIT_MIN_KEYS = 128


class DecodeChoice(NamedTuple):
    tile: tuple       # (BLOCK_M, BLOCK_N, NUM_WARPS, Q_IN_REGISTERS, KV_STAGES)
    pack: int         # PACK_GQA: query heads per tile row group (1: no packing)
    split: int        # KV_SPLIT: CTAs of a cluster sharing the keys (1: no split)
    warp_split: int   # WARP_SPLIT: key groups of warps in a block


def _static(*dims) -> bool:
    return all(isinstance(d, int) for d in dims)


def decode_split(ctas: int, len_kv: int, warp_split: int, arch: str) -> int:
    """KV_SPLIT for a grid of ``ctas`` CTAs (without the split) whose rows attend ``len_kv`` keys, each CTA's keys
    already split over ``warp_split`` key groups."""
    if arch_number(arch) < CLUSTER_ARCH:
        return 1
    for split in SPLITS:
        if ctas * split >= SPLIT_TARGET_CTAS or len_kv < SPLIT_MIN_KEYS * warp_split * split * 2:
            return split
    return SPLITS[-1]


def plan_decode(batch, len_q, len_kv, heads_q, heads_kv, dim: int, dim_v: int, arch: str) -> DecodeChoice | None:
    """The decode plan for these dimensions, or None when the shape is not decode (or not static enough to know)."""
    if not _static(len_q, heads_q, heads_kv) or len_q > DECODE_MAX_QUERIES:
        return None
    if max(-(-dim // 16), -(-dim_v // 16)) * 16 > DECODE_MAX_HEAD_DIM:
        return None
    pack = heads_q // heads_kv
    rows = len_q * pack
    tile, warp_split = next(((t, w) for max_rows, t, w in DECODE_TILES if rows <= max_rows), (None, 1))
    if tile is None:
        return None
    split = 1
    if _static(batch, len_kv):
        ctas = -(-rows // tile[0]) * heads_kv * batch
        split = decode_split(ctas, len_kv, warp_split, arch)
        if ctas * split < SPLIT_TARGET_CTAS:
            tile = DECODE_TILES_SMALL_GRID.get(tile[0], tile)
    if pack == 1 and split == 1:
        return None  # nothing decode-specific: the general tiles serve it
    return DecodeChoice(tile, pack, split, warp_split)
