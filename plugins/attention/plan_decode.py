"""``plan_decode``: the decode part of FusedAttention's launch plan (few queries against many keys): whether the query
heads of a K/V head share a tile (GQA packing, ``PACK_GQA``), the tile that holds those rows, and over how many CTAs
of a thread-block cluster the keys are split (``KV_SPLIT``, attention_split_kv.cuh).

A static choice, from what a TensorRT build knows: packing needs the query length and both head counts as plain ints
(the tile's rows are query length x group); the split also needs the batch and the key length (how many CTAs the
grid has and how many key tiles each would get). Dynamic dimensions fall back to the general plan. Measurements
behind the numbers: NOTES.md, "Decode".
"""
from __future__ import annotations

from typing import NamedTuple

from trt_fusedattn.launcher.arch import CLUSTER_ARCH, arch_number

# Decode tiles on the mma.sync mainloop, by the packed rows they hold: 16 rows per warp, 64-key tiles, two K/V
# stages: (BLOCK_M, BLOCK_N, NUM_WARPS, Q_IN_REGISTERS, KV_STAGES). Every warp of a tile reads the same K/V tile from
# shared memory, so a K/V head is read from memory once per tile.
DECODE_TILES = ((16, (16, 64, 1, 0, 2)), (32, (32, 64, 2, 0, 2)), (64, (64, 64, 4, 0, 2)), (128, (128, 64, 8, 0, 2)))
DECODE_MAX_QUERIES = 16       # longer query blocks fill tiles without packing (prefill, chunked prefill)
DECODE_MAX_HEAD_DIM = 128     # padded Q/K and V head dims the one-warp-per-16-rows tiles hold without spills
# The split: the smallest of SPLITS that gives the grid SPLIT_TARGET_CTAS CTAs (two per SM of a 132-SM H100), as long
# as each CTA keeps SPLIT_MIN_TILES key tiles (below that the DSMEM combine outweighs the keys it spreads).
SPLITS = (1, 2, 4, 8)
SPLIT_TARGET_CTAS = 264
SPLIT_MIN_TILES = 8


class DecodeChoice(NamedTuple):
    tile: tuple   # (BLOCK_M, BLOCK_N, NUM_WARPS, Q_IN_REGISTERS, KV_STAGES)
    pack: int     # PACK_GQA: query heads per tile row group (1: no packing)
    split: int    # KV_SPLIT: CTAs of a cluster sharing the keys (1: no split)


def _static(*dims) -> bool:
    return all(isinstance(d, int) for d in dims)


def decode_split(ctas: int, key_tiles: int, arch: str) -> int:
    """KV_SPLIT for a grid of ``ctas`` CTAs (without the split) whose rows attend ``key_tiles`` tiles of keys."""
    if arch_number(arch) < CLUSTER_ARCH:
        return 1
    for split in SPLITS:
        if ctas * split >= SPLIT_TARGET_CTAS or key_tiles < SPLIT_MIN_TILES * split * 2:
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
    tile = next((t for max_rows, t in DECODE_TILES if rows <= max_rows), None)
    if tile is None:
        return None
    split = 1
    if _static(batch, len_kv):
        block_m, block_n = tile[:2]
        split = decode_split(-(-rows // block_m) * heads_kv * batch, -(-len_kv // block_n), arch)
    if pack == 1 and split == 1:
        return None  # nothing decode-specific: the general tiles serve it
    return DecodeChoice(tile, pack, split)
