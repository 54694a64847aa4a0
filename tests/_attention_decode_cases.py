"""Decode cases of FusedAttention (few queries, many keys): GQA packing (PACK_GQA) with and without the cluster key
split (KV_SPLIT), as the default plan picks them and as tunings force them. The decode GPU test runs them against the
float64 reference and the compile test builds them for sm_90a; ``small`` ones also run under compute-sanitizer."""
from __future__ import annotations

from _attention_cases import AttentionCase

# A packed one-warp tile (16 rows) and a packed four-warp tile (64 rows), one key group each, and the same rows with
# the keys also split over key groups of warps (WARP_SPLIT), forced with the split given per case.
PACKED_16 = (("WGMMA", 0), ("BLOCK_M", 16), ("NUM_WARPS", 1), ("BLOCK_N", 64), ("WARP_SPLIT", 1))
PACKED_64 = (("WGMMA", 0), ("BLOCK_M", 64), ("NUM_WARPS", 4), ("BLOCK_N", 64), ("WARP_SPLIT", 1))
GROUPS4_16 = (("WGMMA", 0), ("BLOCK_M", 16), ("NUM_WARPS", 4), ("BLOCK_N", 16), ("WARP_SPLIT", 4))
GROUPS2_64 = (("WGMMA", 0), ("BLOCK_M", 64), ("NUM_WARPS", 8), ("BLOCK_N", 32), ("WARP_SPLIT", 2))
GROUPS2_32 = (("WGMMA", 0), ("BLOCK_M", 32), ("NUM_WARPS", 4), ("BLOCK_N", 32), ("WARP_SPLIT", 2))
GROUPS4_64_WIDE = (("WGMMA", 0), ("BLOCK_M", 64), ("NUM_WARPS", 8), ("BLOCK_N", 32), ("WARP_SPLIT", 4))  # 32 rows a warp
# 64 packed rows on the wgmma mainloop (sm_90a): key groups of one warpgroup each
WGMMA_GROUPS2_64 = (("WGMMA", 1), ("BLOCK_M", 64), ("NUM_WARPS", 8), ("BLOCK_N", 64), ("WARP_SPLIT", 2))
WGMMA_GROUPS3_64 = (("WGMMA", 1), ("BLOCK_M", 64), ("NUM_WARPS", 12), ("BLOCK_N", 64), ("WARP_SPLIT", 3))
WGMMA_GROUP1_128 = (("WGMMA", 1), ("BLOCK_M", 64), ("NUM_WARPS", 4), ("BLOCK_N", 128), ("WARP_SPLIT", 1))
# session 7's candidates (more bytes in flight a key group at head dim 64): 128-key tiles in two or three groups, four
# groups of 64-key tiles (16 warps); one block an SM's register budget, as the decode plan gives (a tuning alone would
# get the hd64 prefill tiles' two)
ONE_BLOCK = (("MIN_BLOCKS_PER_SM", 1),)
WGMMA_GROUPS2_128 = (("WGMMA", 1), ("BLOCK_M", 64), ("NUM_WARPS", 8), ("BLOCK_N", 128), ("WARP_SPLIT", 2)) + ONE_BLOCK
WGMMA_GROUPS3_128 = (("WGMMA", 1), ("BLOCK_M", 64), ("NUM_WARPS", 12), ("BLOCK_N", 128), ("WARP_SPLIT", 3)) + ONE_BLOCK
WGMMA_GROUPS4_64 = (("WGMMA", 1), ("BLOCK_M", 64), ("NUM_WARPS", 16), ("BLOCK_N", 64), ("WARP_SPLIT", 4)) + ONE_BLOCK
GROUPS3_64 = (("WGMMA", 0), ("BLOCK_M", 64), ("NUM_WARPS", 12), ("BLOCK_N", 32), ("WARP_SPLIT", 3))
# a ring of three K/V stages per key group (KV_STAGES 3: two tiles in flight while one is computed)
STAGES3 = (("KV_STAGES", 3),)
# session 8's deeper ring (KV_STAGES 5) on the 16-row tile of four one-warp groups x32, Q from shared memory as
# v6's default has it (a tuning alone would get head dim 64's Q in registers)
GROUPS4_16_X32 = (("WGMMA", 0), ("BLOCK_M", 16), ("NUM_WARPS", 4), ("BLOCK_N", 32), ("WARP_SPLIT", 4),
                  ("Q_IN_REGISTERS", 0)) + ONE_BLOCK


def _cases():
    llama = dict(heads_q=32, heads_kv=8, dim=128)
    br = dict(causal=1, alignment="bottom_right")
    return [
        # the default plan's choice (no tuning): packs every group; splits where the grid would not fill the GPU
        AttentionCase("gqa32-8-1x4100-keylen", batch=3, len_q=1, len_kv=4100, key_lengths=True, **llama),
        AttentionCase("gqa32-8-2x3000-causal-br", batch=2, len_q=2, len_kv=3000, dtype="float16", **llama, **br),
        AttentionCase("gqa32-8-4x2049-causal-br", batch=1, len_q=4, len_kv=2049, **llama, **br),
        AttentionCase("gqa32-8-16x5000-causal-br", batch=1, len_q=16, len_kv=5000, **llama, **br),
        AttentionCase("gqa32-8-16x300-causal-br-b32", batch=32, len_q=16, len_kv=300, **llama, **br),  # full grid
        # grids that need no split take one wgmma group on sm_90a at any row count: 4 packed rows of a 64-row
        # warpgroup on 64-key tiles (256 CTAs), 16 rows on 128-key tiles (128 CTAs)
        AttentionCase("gqa32-8-1x700-keylen-b32", batch=32, len_q=1, len_kv=700, key_lengths=True, **llama),
        AttentionCase("gqa32-8-4x2000-causal-br-b16", batch=16, len_q=4, len_kv=2000, **llama, **br),
        # v5's split tiles (parts of >= 2k keys): two groups x three stages on clusters of 8, three groups on the
        # 64-CTA grid of 2-CTA clusters, one group x three stages on a 128-CTA grid; head dim 64 on wgmma (since v6:
        # one group of 128-key tiles x three stages on the two 128-CTA grids below)
        AttentionCase("gqa32-8-1x17000", batch=1, len_q=1, len_kv=17000, **llama),
        AttentionCase("gqa32-8-16x9000-causal-br-b4-hd64", batch=4, len_q=16, len_kv=9000, heads_q=32, heads_kv=8,
                      dim=64, small=True, **br),
        AttentionCase("gqa32-8-2x8200-keylen-b4-hd64-fp16", batch=4, len_q=2, len_kv=8200, heads_q=32, heads_kv=8,
                      dim=64, dtype="float16", key_lengths=True),
        AttentionCase("mqa8-1-1x2000-bool-b11k", len_q=1, len_kv=2000, heads_q=8, heads_kv=1, dim=128, mask="bool",
                      mask_shape=(2, 1, 1, 2000), small=True),
        AttentionCase("mqa8-1-16x1000-causal-br", len_q=16, len_kv=1000, heads_q=8, heads_kv=1, dim=128,
                      dtype="float16", **br),
        AttentionCase("mqa8-1-3x700-causal-br-keylen", len_q=3, len_kv=700, heads_q=8, heads_kv=1, key_lengths=True,
                      **br),
        AttentionCase("mha4-4-2x4096", len_q=2, len_kv=4096, heads_q=4, heads_kv=4, dim=128),
        AttentionCase("gqa8-2-2x900-additive-per-head", len_q=2, len_kv=900, heads_q=8, heads_kv=2, dim=128,
                      mask="additive", small=True),
        AttentionCase("gqa8-2-5x1200-bool-per-head-causal-br", len_q=5, len_kv=1200, heads_q=8, heads_kv=2, mask="bool",
                      dtype="float16", **br),
        AttentionCase("gqa8-2-4x800-additive-1hqk", len_q=4, len_kv=800, heads_q=8, heads_kv=2, mask="additive",
                      mask_shape=(1, 8, 4, 800)),
        AttentionCase("gqa8-2-3x1500-softcap-hd64", len_q=3, len_kv=1500, heads_q=8, heads_kv=2, softcap=4.0,
                      scale=0.6, dtype="float16"),
        AttentionCase("gqa8-2-5x600-bhsd-causal-tl", len_q=5, len_kv=600, heads_q=8, heads_kv=2, layout="BHSD",
                      causal=1, small=True),
        AttentionCase("gqa8-2-1x1-keylen", len_q=1, len_kv=1, heads_q=8, heads_kv=2, dim=128, key_lengths=True,
                      small=True),
        AttentionCase("gqa6-3-7x333-hd40", len_q=7, len_kv=333, heads_q=6, heads_kv=3, dim=40),
        AttentionCase("gqa4-2-2x500-hd20-dv33", len_q=2, len_kv=500, heads_q=4, heads_kv=2, dim=20, dim_v=33,
                      dtype="float16", small=True),
        AttentionCase("gqa8-2-3x1000-dv64-128", len_q=3, len_kv=1000, heads_q=8, heads_kv=2, dim=64, dim_v=128),
        # forced packing and splits: uneven splits, more CTAs than key tiles, packing without a split (sm_80's way)
        AttentionCase("packed16-split8-uneven-1x837", len_q=1, len_kv=64 * 13 + 5, heads_q=8, heads_kv=2, dim=128,
                      tuning=PACKED_16 + (("PACK_GQA", 4), ("KV_SPLIT", 8)), small=True),
        AttentionCase("packed16-split8-more-ctas-than-tiles", len_q=2, len_kv=100, heads_q=8, heads_kv=2, dim=128,
                      key_lengths=True, tuning=PACKED_16 + (("PACK_GQA", 4), ("KV_SPLIT", 8)), small=True),
        AttentionCase("packed16-nosplit-4x3000-causal-br", len_q=4, len_kv=3000, heads_q=8, heads_kv=2, dim=128,
                      tuning=PACKED_16 + (("PACK_GQA", 4), ("KV_SPLIT", 1)), **br),
        AttentionCase("packed64-split4-16x2500-causal-br-keylen", len_q=16, len_kv=2500, heads_q=8, heads_kv=2,
                      dim=128, key_lengths=True, tuning=PACKED_64 + (("PACK_GQA", 4), ("KV_SPLIT", 4)), **br),
        AttentionCase("packed64-split2-8x1000-bool", len_q=8, len_kv=1000, heads_q=16, heads_kv=2, dim=128,
                      mask="bool", tuning=PACKED_64 + (("PACK_GQA", 8), ("KV_SPLIT", 2)), small=True),
        # key groups of warps: alone (the block's own combine, no cluster), with a cluster, with named barriers
        AttentionCase("groups4-nosplit-1x1000-keylen", batch=3, len_q=1, len_kv=1000, heads_q=8, heads_kv=2, dim=128,
                      key_lengths=True, tuning=GROUPS4_16 + (("PACK_GQA", 4), ("KV_SPLIT", 1)), small=True),
        AttentionCase("groups4-split8-uneven-2x3001-causal-br", len_q=2, len_kv=3001, heads_q=8, heads_kv=2,
                      dim=128, tuning=GROUPS4_16 + (("PACK_GQA", 4), ("KV_SPLIT", 8)), small=True, **br),
        AttentionCase("groups4-split4-more-parts-than-tiles", len_q=1, len_kv=200, heads_q=8, heads_kv=2, dim=64,
                      dtype="float16", tuning=GROUPS4_16 + (("PACK_GQA", 4), ("KV_SPLIT", 4))),
        AttentionCase("groups2-64rows-split2-16x2000-additive", len_q=16, len_kv=2000, heads_q=8, heads_kv=2, dim=128,
                      mask="additive", mask_shape=(2, 1, 16, 2000),
                      tuning=GROUPS2_64 + (("PACK_GQA", 4), ("KV_SPLIT", 2)), small=True),
        AttentionCase("groups2-64rows-nosplit-16x700-causal-br", len_q=16, len_kv=700, heads_q=8, heads_kv=2, dim=128,
                      tuning=GROUPS2_64 + (("PACK_GQA", 4), ("KV_SPLIT", 1)), small=True, **br),
        # two 32-row tiles of two key groups for 64 packed rows (16 queries of 32/8 GQA), an uneven cluster split
        AttentionCase("groups2-32rows-split4-uneven-16x2999-causal-br", len_q=16, len_kv=2999, heads_q=8, heads_kv=2,
                      dim=128, tuning=GROUPS2_32 + (("PACK_GQA", 4), ("KV_SPLIT", 4)), small=True, **br),
        AttentionCase("groups4-64rows-32-a-warp-split2-16x1900-causal-br-keylen", batch=3, len_q=16, len_kv=1900,
                      heads_q=8, heads_kv=2, dim=128, key_lengths=True,
                      tuning=GROUPS4_64_WIDE + (("PACK_GQA", 4), ("KV_SPLIT", 2)), small=True, **br),
        # the wgmma mainloop's decode tiles: packed Q rows in the swizzled tile, key groups of one warpgroup, the
        # cluster split; uneven splits, key lengths 0 and 1, a partial 64-row tile, masks, head dim 64
        AttentionCase("wgmma-groups2-split4-uneven-16x2999-causal-br", len_q=16, len_kv=2999, heads_q=8, heads_kv=2,
                      dim=128, tuning=WGMMA_GROUPS2_64 + (("PACK_GQA", 4), ("KV_SPLIT", 4)), small=True, **br),
        AttentionCase("wgmma-groups3-nosplit-16x700-causal-br-keylen", batch=3, len_q=16, len_kv=700, heads_q=8,
                      heads_kv=2, dim=128, key_lengths=True, tuning=WGMMA_GROUPS3_64 + (("PACK_GQA", 4), ("KV_SPLIT", 1)),
                      small=True, **br),
        # the block's own combine (no cluster) after key groups of several warps whose tile counts differ (15 tiles
        # over two groups, key lengths): racecheck's cases for the named-barrier padding in attention.cu (NOTES.md)
        AttentionCase("wgmma-groups2-nosplit-16x900-causal-br-keylen", batch=3, len_q=16, len_kv=900, heads_q=8,
                      heads_kv=2, dim=128, key_lengths=True, tuning=WGMMA_GROUPS2_64 + (("PACK_GQA", 4), ("KV_SPLIT", 1)),
                      small=True, **br),
        AttentionCase("wgmma-groups2-nosplit-16x900-causal-br", batch=3, len_q=16, len_kv=900,
                      heads_q=8, heads_kv=2, dim=128, tuning=WGMMA_GROUPS2_64 + (("PACK_GQA", 4), ("KV_SPLIT", 1)),
                      small=True, **br),
        AttentionCase("groups3-64rows-nosplit-16x700-causal-br-keylen", batch=3, len_q=16, len_kv=700, heads_q=8,
                      heads_kv=2, dim=128, key_lengths=True, tuning=GROUPS3_64 + (("PACK_GQA", 4), ("KV_SPLIT", 1)),
                      small=True, **br),
        AttentionCase("wgmma-group1-x128-split2-8x1000-bool", len_q=8, len_kv=1000, heads_q=16, heads_kv=2, dim=128,
                      mask="bool", tuning=WGMMA_GROUP1_128 + (("PACK_GQA", 8), ("KV_SPLIT", 2)), small=True),
        AttentionCase("wgmma-groups2-split8-keylen-0-and-1", batch=2, len_q=16, len_kv=1, heads_q=8, heads_kv=2,
                      dim=128, key_lengths=True, tuning=WGMMA_GROUPS2_64 + (("PACK_GQA", 4), ("KV_SPLIT", 8)),
                      small=True, **br),
        AttentionCase("wgmma-groups2-split2-5x1200-causal-br-fp16", len_q=5, len_kv=1200, heads_q=8, heads_kv=2,
                      dim=128, dtype="float16", tuning=WGMMA_GROUPS2_64 + (("PACK_GQA", 4), ("KV_SPLIT", 2)), **br),
        AttentionCase("wgmma-groups2-hd64-16x1500-additive-per-head", len_q=16, len_kv=1500, heads_q=8, heads_kv=2,
                      dim=64, mask="additive", tuning=WGMMA_GROUPS2_64 + (("PACK_GQA", 4), ("KV_SPLIT", 2))),
        # three K/V stages a key group (the prologue's second tile, the ring, empty groups past the last tile): an
        # uneven cluster split, a one-tile part, key lengths 0 and 1, unequal tile counts without a cluster, head dim 64
        AttentionCase("wgmma-groups2-3stages-split4-uneven-16x2999-causal-br", len_q=16, len_kv=2999, heads_q=8,
                      heads_kv=2, dim=128, tuning=WGMMA_GROUPS2_64 + STAGES3 + (("PACK_GQA", 4), ("KV_SPLIT", 4)),
                      small=True, **br),
        AttentionCase("wgmma-groups2-3stages-nosplit-16x900-causal-br-keylen", batch=3, len_q=16, len_kv=900,
                      heads_q=8, heads_kv=2, dim=128, key_lengths=True,
                      tuning=WGMMA_GROUPS2_64 + STAGES3 + (("PACK_GQA", 4), ("KV_SPLIT", 1)), small=True, **br),
        AttentionCase("wgmma-groups2-3stages-split8-keylen-0-and-1", batch=2, len_q=16, len_kv=1, heads_q=8, heads_kv=2,
                      dim=128, key_lengths=True,
                      tuning=WGMMA_GROUPS2_64 + STAGES3 + (("PACK_GQA", 4), ("KV_SPLIT", 8)), small=True, **br),
        AttentionCase("wgmma-group1-3stages-x64-1x1000-keylen-b5", batch=5, len_q=1, len_kv=1000, heads_q=32,
                      heads_kv=8, dim=128, key_lengths=True, tuning=(("WGMMA", 1), ("BLOCK_M", 64), ("NUM_WARPS", 4),
                      ("BLOCK_N", 64), ("WARP_SPLIT", 1)) + STAGES3 + (("PACK_GQA", 4), ("KV_SPLIT", 1)), small=True),
        AttentionCase("groups4-3stages-split8-uneven-2x3001-causal-br", len_q=2, len_kv=3001, heads_q=8, heads_kv=2,
                      dim=128, tuning=GROUPS4_16 + STAGES3 + (("PACK_GQA", 4), ("KV_SPLIT", 8)), small=True, **br),
        AttentionCase("wgmma-groups2-3stages-hd64-16x1500-split2-fp16", len_q=16, len_kv=1500, heads_q=8, heads_kv=2,
                      dim=64, dtype="float16", tuning=WGMMA_GROUPS2_64 + STAGES3 + (("PACK_GQA", 4), ("KV_SPLIT", 2)),
                      small=True),
        # session 7's candidate tiles (head dim 64): uneven cluster splits, key lengths 0 and 1, unequal tile counts
        # without a cluster, a one-tile part
        AttentionCase("wgmma-groups2-x128-3stages-hd64-split8-uneven-1x5000", len_q=1, len_kv=5000, heads_q=8,
                      heads_kv=2, dim=64, tuning=WGMMA_GROUPS2_128 + STAGES3 + (("PACK_GQA", 4), ("KV_SPLIT", 8)),
                      small=True),
        AttentionCase("wgmma-groups2-x128-3stages-hd64-nosplit-16x1900-causal-br-keylen", batch=3, len_q=16,
                      len_kv=1900, heads_q=8, heads_kv=2, dim=64, key_lengths=True,
                      tuning=WGMMA_GROUPS2_128 + STAGES3 + (("PACK_GQA", 4), ("KV_SPLIT", 1)), small=True, **br),
        AttentionCase("wgmma-groups4-3stages-hd64-split2-4x3001-causal-br-fp16", len_q=4, len_kv=3001, heads_q=8,
                      heads_kv=2, dim=64, dtype="float16",
                      tuning=WGMMA_GROUPS4_64 + STAGES3 + (("PACK_GQA", 4), ("KV_SPLIT", 2)), small=True, **br),
        AttentionCase("wgmma-groups4-3stages-hd64-nosplit-16x1000-causal-br-keylen", batch=3, len_q=16, len_kv=1000,
                      heads_q=8, heads_kv=2, dim=64, key_lengths=True,
                      tuning=WGMMA_GROUPS4_64 + STAGES3 + (("PACK_GQA", 4), ("KV_SPLIT", 1)), small=True, **br),
        AttentionCase("wgmma-groups4-3stages-hd64-split8-keylen-0-and-1", batch=2, len_q=16, len_kv=1, heads_q=8,
                      heads_kv=2, dim=64, key_lengths=True,
                      tuning=WGMMA_GROUPS4_64 + STAGES3 + (("PACK_GQA", 4), ("KV_SPLIT", 8)), small=True, **br),
        AttentionCase("wgmma-groups3-x128-hd64-split4-uneven-2x9000-keylen", batch=2, len_q=2, len_kv=9000, heads_q=8,
                      heads_kv=2, dim=64, key_lengths=True,
                      tuning=WGMMA_GROUPS3_128 + (("PACK_GQA", 4), ("KV_SPLIT", 4)), small=True),
        AttentionCase("wgmma-group1-x128-3stages-hd64-split2-1x4100", batch=2, len_q=1, len_kv=4100, heads_q=32,
                      heads_kv=8, dim=64, tuning=WGMMA_GROUP1_128 + STAGES3 + ONE_BLOCK + (("PACK_GQA", 4), ("KV_SPLIT", 2))),
        AttentionCase("groups4-x32-3stages-hd64-split8-1x3000", len_q=1, len_kv=3000, heads_q=8, heads_kv=2, dim=64,
                      tuning=(("WGMMA", 0), ("BLOCK_M", 16), ("NUM_WARPS", 4), ("BLOCK_N", 32), ("WARP_SPLIT", 4))
                      + STAGES3 + (("PACK_GQA", 4), ("KV_SPLIT", 8)), small=True),
        # v6's head-dim-64 defaults: the 16-row mma.sync tile x three stages on 64 CTAs, two groups of 128-key tiles on
        # 64 CTAs, one group of 64-key tiles on 256 CTAs (clusters of 8)
        AttentionCase("gqa32-8-1x20000-keylen-hd64", batch=2, len_q=1, len_kv=20000, heads_q=16, heads_kv=4, dim=64,
                      key_lengths=True),
        AttentionCase("gqa32-8-16x17000-causal-br-hd64", batch=1, len_q=16, len_kv=17000, heads_q=32, heads_kv=8, dim=64, **br),
        AttentionCase("gqa32-8-3x16500-causal-br-b4-hd64-fp16", batch=4, len_q=3, len_kv=16500, heads_q=32, heads_kv=8,
                      dim=64, dtype="float16", **br),
        # three wgmma groups on a cluster of 8 (the --candidates h200 column "64 CTAs: 3 groups x64, 2 stages" at batch
        # 1): 24 parts, an uneven split, key lengths
        AttentionCase("wgmma-groups3-split8-uneven-2x7000-keylen", batch=2, len_q=2, len_kv=7000, heads_q=8, heads_kv=2,
                      dim=128, key_lengths=True, tuning=WGMMA_GROUPS3_64 + (("PACK_GQA", 4), ("KV_SPLIT", 8)),
                      small=True),
        # v7's defaults: head dim 128, 32 CTAs x a split of 2, 16.5k keys a CTA: three groups x two stages; head dim
        # 64, 64 CTAs x a split of 2 (2050 keys a CTA: an uneven last tile): the 16-row tile x five stages
        AttentionCase("gqa32-8-1x33000-b4", batch=4, len_q=1, len_kv=33000, **llama),
        AttentionCase("gqa32-8-3x4100-causal-br-b8-hd64", batch=8, len_q=3, len_kv=4100, heads_q=32, heads_kv=8, dim=64,
                      **br),
        # and head dim 64 at batch 4: three groups of 128-key tiles x two stages at split 2 (16.4k keys a CTA, uneven)
        AttentionCase("gqa32-8-2x32800-causal-br-b4-hd64", batch=4, len_q=2, len_kv=32800, heads_q=32, heads_kv=8, dim=64,
                      **br),
        # the two v7 three-group tiles over a 2-CTA cluster, small (sanitizers): uneven split, key lengths
        AttentionCase("wgmma-groups3-split2-uneven-1x3001-keylen", batch=2, len_q=1, len_kv=3001, heads_q=8,
                      heads_kv=2, dim=128, key_lengths=True,
                      tuning=WGMMA_GROUPS3_64 + ONE_BLOCK + (("PACK_GQA", 4), ("KV_SPLIT", 2)), small=True),
        AttentionCase("wgmma-groups3-x128-hd64-split2-uneven-4x3001-causal-br", len_q=4, len_kv=3001, heads_q=8,
                      heads_kv=2, dim=64, tuning=WGMMA_GROUPS3_128 + (("PACK_GQA", 4), ("KV_SPLIT", 2)), small=True,
                      **br),
        # session 8's deeper ring (five stages: the prologue's four tiles, parts with fewer tiles than
        # stages, empty groups past the last tile), uneven splits, key lengths 0 and 1, unequal tile counts without a
        # cluster (Q in registers on that tile: groups4-x32-3stages-hd64-split8-1x3000 above)
        AttentionCase("groups4-x32-5stages-hd64-split8-uneven-1x3001", len_q=1, len_kv=3001, heads_q=8, heads_kv=2,
                      dim=64, tuning=GROUPS4_16_X32 + (("KV_STAGES", 5), ("PACK_GQA", 4), ("KV_SPLIT", 8)), small=True),
        AttentionCase("groups4-x32-5stages-hd64-split8-keylen-0-and-1", batch=2, len_q=2, len_kv=1, heads_q=8,
                      heads_kv=2, dim=64, key_lengths=True,
                      tuning=GROUPS4_16_X32 + (("KV_STAGES", 5), ("PACK_GQA", 4), ("KV_SPLIT", 8)), small=True),
        AttentionCase("groups4-x32-5stages-hd64-split2-3x2100-causal-br", len_q=3, len_kv=2100, heads_q=8, heads_kv=2,
                      dim=64, tuning=GROUPS4_16_X32 + (("KV_STAGES", 5), ("PACK_GQA", 4), ("KV_SPLIT", 2)), small=True,
                      **br),
        AttentionCase("groups4-x32-5stages-hd64-nosplit-4x2500-causal-br-keylen-fp16", batch=3, len_q=4, len_kv=2500,
                      heads_q=8, heads_kv=2, dim=64, dtype="float16", key_lengths=True,
                      tuning=GROUPS4_16_X32 + (("KV_STAGES", 5), ("PACK_GQA", 4), ("KV_SPLIT", 1)), small=True, **br),
        AttentionCase("wgmma-groups2-5stages-hd64-nosplit-16x1900-causal-br-keylen", batch=3, len_q=16, len_kv=1900,
                      heads_q=8, heads_kv=2, dim=64, key_lengths=True,
                      tuning=WGMMA_GROUPS2_64 + ONE_BLOCK + (("KV_STAGES", 5), ("PACK_GQA", 4), ("KV_SPLIT", 1)),
                      small=True, **br),
        AttentionCase("wgmma-groups2-5stages-hd64-split8-uneven-16x5000-causal-br", len_q=16, len_kv=5000, heads_q=8,
                      heads_kv=2, dim=64,
                      tuning=WGMMA_GROUPS2_64 + ONE_BLOCK + (("KV_STAGES", 5), ("PACK_GQA", 4), ("KV_SPLIT", 8)),
                      small=True, **br),
        AttentionCase("wgmma-group1-x64-5stages-hd64-split2-4x3001-causal-br-fp16", len_q=4, len_kv=3001, heads_q=8,
                      heads_kv=2, dim=64, dtype="float16", tuning=(("WGMMA", 1), ("BLOCK_M", 64), ("NUM_WARPS", 4),
                      ("BLOCK_N", 64), ("WARP_SPLIT", 1), ("KV_STAGES", 5), ("PACK_GQA", 4), ("KV_SPLIT", 2)),
                      small=True, **br),
        # key lengths 0 (batch 0) and 1 (the only key) over 8 CTAs x 4 key groups: 31 of the 32 parts see no key
        AttentionCase("groups4-split8-keylen-0-and-1", batch=2, len_q=2, len_kv=1, heads_q=8, heads_kv=2, dim=128,
                      key_lengths=True, tuning=GROUPS4_16 + (("PACK_GQA", 4), ("KV_SPLIT", 8)), small=True),
    ]


DECODE_CASES = _cases()
