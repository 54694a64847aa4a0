"""plan_attention (CPU): launch geometry, scalars, defines, and one-line rejections of what no kernel serves."""
from __future__ import annotations

import math

import pytest

from trt_fusedattn.launcher.arch import SHARED_LIMIT
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.plan import TILES, plan_attention, shared_mem_bytes


def plan(q=(2, 100, 8, 64), kv=(2, 77, 2, 64), mask=None, lengths=None, dtype="float16", mask_dtype=None,
         arch="sm_90a", **attrs):
    return plan_attention([q, kv, kv, mask, lengths],
                          [dtype, dtype, dtype, mask_dtype, "int32" if lengths else None],
                          FUSED_ATTENTION.resolve(attrs), arch)


def test_bshd_geometry_and_scalars():
    p = plan(arch="sm_80")  # the mma.sync tile table (sm_90a may pick the wgmma mainloop: test_attention_sm90_plan)
    block_m, block_n, warps, _, stages = TILES[64]
    assert p.kernel == "fused_attention" and p.source.name == "attention.cu"
    assert p.grid == (math.ceil(100 / block_m), 8, 2) and p.block == (32 * warps, 1, 1)
    assert p.shared_mem == (block_m + 2 * stages * block_n) * (64 + 8) * 2
    # B, Hq, Hkv, Lq, Lkv, Q strides (batch, head, seq), K strides, V strides, O strides
    assert p.scalars == (2, 8, 2, 100, 77, 100 * 8 * 64, 64, 8 * 64, 77 * 2 * 64, 64, 2 * 64, 77 * 2 * 64, 64, 2 * 64,
                         100 * 8 * 64, 64, 8 * 64)
    assert p.defines["MASK_KIND"] == 0 and p.defines["HAS_KEY_LENGTHS"] == 0 and p.defines["DTYPE_BF16"] == 0
    assert float(p.defines["SCALE_LOG2"].rstrip("f")) == pytest.approx(math.log2(math.e) / 8, rel=1e-7)


def test_bhsd_strides_scale_and_causal_defines():
    p = plan(q=(2, 8, 100, 128), kv=(2, 2, 77, 128), dtype="bfloat16", layout="BHSD", scale=0.5, causal=1,
             causal_alignment="bottom_right")
    q_strides, kv_strides = (8 * 100 * 128, 100 * 128, 128), (2 * 77 * 128, 77 * 128, 128)
    assert p.scalars[5:] == q_strides + kv_strides + kv_strides + q_strides  # Q, K, V, O
    assert p.defines["CAUSAL"] == 1 and p.defines["CAUSAL_BOTTOM_RIGHT"] == 1 and p.defines["DTYPE_BF16"] == 1
    assert float(p.defines["SCALE_LOG2"].rstrip("f")) == pytest.approx(0.5 * math.log2(math.e), rel=1e-7)
    # alignment is meaningless without causal: no separate specialization
    assert plan(causal=0, causal_alignment="bottom_right").defines["CAUSAL_BOTTOM_RIGHT"] == 0


@pytest.mark.parametrize("mask_shape, strides", [
    ((2, 8, 100, 77), (8 * 100 * 77, 100 * 77, 77, 1)),
    ((100, 77), (0, 0, 77, 1)),
    ((2, 1, 1, 77), (77, 0, 0, 1)),
    ((1, 8, 100, 77), (0, 100 * 77, 77, 1)),
])
def test_mask_broadcast_strides(mask_shape, strides):
    p = plan(mask=mask_shape, mask_dtype="float16", lengths=(2,))
    assert p.defines["MASK_KIND"] == 1 and p.defines["HAS_KEY_LENGTHS"] == 1
    assert p.scalars[17:] == strides
    assert plan(mask=mask_shape, mask_dtype="bool").defines["MASK_KIND"] == 2


@pytest.mark.parametrize("arch", sorted(SHARED_LIMIT))
@pytest.mark.parametrize("mask", [None, "bool"])
def test_every_head_dim_fits_every_gpu(arch, mask):
    """Issue 8: head dim 128 needed 104,448 B on the 99 KB GPUs (sm_86/sm_89/sm_120); the plan now shrinks the K/V
    tile until the stages fit."""
    for dim in (*TILES, 40, 80, 160, 200, 512):
        p = plan(q=(2, 300, 4, dim), kv=(2, 300, 4, dim), mask=None if mask is None else (300, 300),
                 mask_dtype=mask, arch=arch)
        assert p.shared_mem <= SHARED_LIMIT[arch]
    if SHARED_LIMIT[arch] < 128 * 1024:
        p = plan(q=(2, 300, 4, 128), kv=(2, 300, 4, 128), arch=arch)
        assert (p.defines["BLOCK_M"], p.defines["BLOCK_N"]) == (128, 32) and p.shared_mem == 69632


def test_small_shared_memory_gpus_get_smaller_tiles():
    for arch, limit in (("sm_86", 99 * 1024), ("sm_80", 163 * 1024), ("sm_90a", 227 * 1024)):
        p = plan(q=(1, 300, 2, 256), kv=(1, 300, 2, 256), arch=arch)
        assert p.shared_mem <= limit
    assert shared_mem_bytes(256, 64, 16, 2) <= 99 * 1024


class Symbolic:
    """Stands in for a TensorRT symbolic dimension (not an int): plan may only add, subtract, multiply,
    floor-divide it; comparing or branching on it fails."""
    def __init__(self, value):
        self.value = value

    def __int__(self):
        return self.value

    def _no(self, *a):
        raise AssertionError("plan compared or branched on a dynamic dimension")
    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __index__ = _no
    __hash__ = None
    for _op in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__"):
        locals()[_op] = (lambda op: lambda self, o: Symbolic(getattr(int, op)(self.value, int(o))))(_op)


def test_dynamic_dims_use_only_arithmetic():
    b, lq, lkv = Symbolic(3), Symbolic(500), Symbolic(700)
    p = plan(q=(b, lq, 8, 64), kv=(b, lkv, 8, 64), mask=(b, 1, lq, lkv), mask_dtype="bool", lengths=(b,))
    assert int(p.grid[0]) == math.ceil(500 / TILES[64][0]) and int(p.grid[2]) == 3 and int(p.scalars[4]) == 700


@pytest.mark.parametrize("kwargs, message", [
    (dict(q=(2, 100, 8, 600), kv=(2, 77, 2, 600)), "outside"),
    (dict(dtype="float32"), "float16 or bfloat16"),
    (dict(kv=(2, 77, 2, 128)), "head dims differ"),
    (dict(kv=(3, 77, 2, 64)), "batch differ"),
    (dict(kv=(2, 77, 3, 64)), "multiple of key/value heads"),
    (dict(q=(2, 100, 64)), "rank 4"),
    (dict(mask=(2, 8, 100, 78), mask_dtype="float16"), "key length"),
    (dict(mask=(100, 77), mask_dtype="float32"), "mask must be bool"),
    (dict(mask=(77,), mask_dtype="bool"), "rank 2, 3 or 4"),
    (dict(lengths=(3,)), "key_lengths and batch"),
    (dict(layout="SBHD"), "layout"),
])
def test_rejections(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan(**kwargs)


def test_tuning_overrides_defines_and_rejects_unknown_names():
    p = plan_attention([(1, 300, 2, 128)] * 3 + [None, None], ["bfloat16"] * 3 + [None, None],
                       FUSED_ATTENTION.resolve({}), "sm_90a", tuning={"BLOCK_N": 64, "RESCALE_THRESHOLD": "0.0f"})
    assert p.defines["BLOCK_N"] == 64 and p.defines["RESCALE_THRESHOLD"] == "0.0f"
    with pytest.raises(ValueError, match="unknown tuning"):
        plan_attention([(1, 300, 2, 128)] * 3 + [None, None], ["bfloat16"] * 3 + [None, None],
                       FUSED_ATTENTION.resolve({}), "sm_90a", tuning={"BLOCK_K": 64})


def test_padded_and_unequal_head_dims_and_softcap():
    """Issue 14: any head dim (padded in the kernel), D_v != D_qk (V's and O's own strides), softcap as a define."""
    p = plan_attention([(2, 100, 8, 40), (2, 77, 2, 40), (2, 77, 2, 24), None, None], ["float16"] * 3 + [None, None],
                       FUSED_ATTENTION.resolve({"softcap": 30.0}), "sm_90a")
    assert p.source.name == "attention.cu" and p.defines["WGMMA"] == 0  # wgmma takes D_qk == D_v in {64, 128} only
    assert (p.defines["HEAD_DIM"], p.defines["HEAD_DIM_V"], p.defines["SOFTCAP"]) == (40, 24, "30.0f")
    assert (p.defines["BLOCK_M"], p.defines["BLOCK_N"]) == TILES[64][:2]  # the tile of the next keyed head dim
    assert p.scalars[11:17] == (77 * 2 * 24, 24, 2 * 24, 100 * 8 * 24, 24, 8 * 24)  # V, O strides
    pitch_qk, pitch_v = 48 + 8, 32 + 8
    assert p.shared_mem == (128 * pitch_qk + 2 * 64 * (pitch_qk + pitch_v)) * 2
    assert plan(q=(2, 100, 8, 512), kv=(2, 77, 2, 512), arch="sm_89").shared_mem <= 101376  # one stage there
    with pytest.raises(ValueError, match="softcap"):
        plan(softcap=-1.0)
    with pytest.raises(ValueError, match="wgmma mainloop"):
        plan_attention([(2, 100, 8, 64), (2, 77, 2, 64), (2, 77, 2, 128), None, None], ["float16"] * 3 + [None, None],
                       FUSED_ATTENTION.resolve({}), "sm_90a", tuning={"WGMMA": 1})


def _decode(batch=1, lq=1, lkv=32768, hq=32, hkv=8, dim=128, arch="sm_90a", mask=None, **attrs):
    return plan_attention([(batch, lq, hq, dim), (batch, lkv, hkv, dim), (batch, lkv, hkv, dim), mask, None],
                          ["bfloat16"] * 3 + [None if mask is None else "bool", None], FUSED_ATTENTION.resolve(attrs),
                          arch)


@pytest.mark.parametrize("batch, lq, lkv, hq, hkv, tile, groups, split, wgmma, stages", [
    (4, 1, 32768, 32, 8, (64, 64, 12), 3, 2, 1, 2),  # v7 (hd128): 32 CTAs x 2 give 64 of 16k keys: three groups
    (32, 1, 4096, 32, 8, (64, 64, 4), 1, 1, 1, 2),   # 256 CTAs fill the GPU: no split, one wgmma group (4 of 64 rows)
    (16, 4, 4096, 32, 8, (64, 128, 4), 1, 1, 1, 2),  # 128 CTAs: no split, one wgmma group of 128-key tiles
    (1, 16, 32768, 32, 8, (64, 64, 8), 2, 8, 1, 3),  # 64 packed rows: one tile per K/V head, two wgmma groups
    (4, 16, 32768, 32, 8, (64, 64, 12), 3, 2, 1, 2),  # 32 one-an-SM CTAs: x4 in clusters of 4 would exceed 120 at once
    (1, 16, 1000, 8, 1, (128, 64, 8), 1, 4, 0, 2),   # MQA: 128 rows in one tile; 1000 keys split in 4 (>= 128 a part)
    (8, 3, 4096, 32, 8, (64, 64, 4), 1, 2, 1, 3),    # 12 rows in one 64-row tile; 64 CTAs x 2 give 128
    (2, 5, 8192, 16, 2, (64, 64, 8), 2, 8, 1, 2),    # 40 rows in a 64-row tile of 2 wgmma groups; 8 x 2 parts of 1k
    (1, 1, 4096, 32, 8, (16, 32, 4), 4, 8, 0, 2),    # 8 x 8 parts of 512 keys (L2-resident K/V): the mma.sync tile
])
def test_decode_packs_a_kv_heads_query_heads_and_splits_small_grids(batch, lq, lkv, hq, hkv, tile, groups, split,
                                                                     wgmma, stages):
    """Issue 10 item 2: the query heads of one K/V head share a tile (rows = query x head of the group), the grid runs
    over K/V heads, the block's warps form key groups, and the keys split over a cluster until the grid has a CTA per
    SM (while each part keeps 128 keys). At head dims 64/128 on sm_90a, 64-row tiles, grids that need no split and
    (v5) split grids whose parts keep >= 2k keys run on the wgmma mainloop, the latter with three K/V stages a group
    (except three groups on the 64-CTA grids of 2-CTA clusters)."""
    p = _decode(batch, lq, lkv, hq, hkv, causal=1, causal_alignment="bottom_right")
    assert p.source.name == "attention.cu" and p.defines["WGMMA"] == wgmma and p.defines["PACK_GQA"] == hq // hkv
    assert (p.defines["BLOCK_M"], p.defines["BLOCK_N"], p.defines["NUM_WARPS"]) == tile
    assert p.defines["WARP_SPLIT"] == groups and p.defines["KV_SPLIT"] == split and p.block == (32 * tile[2], 1, 1)
    assert p.grid == (-(-lq * hq // hkv // tile[0]) * split, hkv, batch) and p.defines["KV_STAGES"] == stages


def test_v5_split_tiles_fit_where_the_rule_says():
    """v5's split tiles (head dim 128): two groups x three stages on clusters of 8 (one block an SM), one group x three
    stages on grids of >= 128 CTAs (two blocks an SM: 115,696 B each plus the 1 KB the driver reserves a block, within
    an H100/H200 SM's 233,472 B)."""
    split8 = _decode(batch=1, lkv=32768)
    full = _decode(batch=8, lkv=4096)
    assert (split8.defines["WARP_SPLIT"], split8.defines["KV_STAGES"], split8.defines["KV_SPLIT"]) == (2, 3, 8)
    assert (full.defines["WARP_SPLIT"], full.defines["KV_STAGES"], full.defines["KV_SPLIT"]) == (1, 3, 2)
    assert split8.defines["WGMMA"] == full.defines["WGMMA"] == 1
    assert full.shared_mem == (64 + 2 * 3 * 64) * 128 * 2 + 1024 - 16
    assert 2 * (full.shared_mem + 1024) <= 233472


@pytest.mark.parametrize("batch, lq, lkv, tile, groups, stages, split, wgmma", [
    (1, 1, 32768, (16, 32, 4), 4, 3, 8, 0),     # 64 CTAs, 4 rows: the 16-row mma.sync tile, four groups x three stages
    (1, 4, 131072, (16, 32, 4), 4, 3, 8, 0),    # 16 rows alike
    (1, 16, 32768, (64, 128, 8), 2, 3, 8, 1),   # 64 CTAs, 64 rows: two groups of 128-key tiles
    (8, 1, 4096, (64, 128, 4), 1, 3, 2, 1),     # 128 CTAs (split 4 would leave parts of 1k keys)
    (2, 16, 32768, (64, 128, 4), 1, 3, 8, 1),   # 128 CTAs at split 8
    (4, 1, 32768, (64, 64, 4), 1, 3, 8, 1),     # 256 CTAs of a three-an-SM tile in clusters of 8
    (4, 16, 131072, (64, 64, 4), 1, 3, 8, 1),
])
def test_v6_head_dim_64_split_tiles_follow_the_grid(batch, lq, lkv, tile, groups, stages, split, wgmma):
    """v6 (head dim 64, sm_90a, where v5's split tiles apply): the largest split whose grid stays <= 256 CTAs with
    parts of >= 2k keys, the tile by the grid after it; 256 CTAs fit in one wave because the tile fits three an SM."""
    from unittest import mock
    from trt_fusedattn.plugins.attention import plan_decode
    with mock.patch.object(plan_decode, "V7_HEAD_DIMS", ()), mock.patch.object(plan_decode, "V7_MMA16_HEAD_DIMS", ()):
        p = _decode(batch, lq, lkv, dim=64, causal=int(lq > 1), causal_alignment="bottom_right")
    d = p.defines
    assert (d["BLOCK_M"], d["BLOCK_N"], d["NUM_WARPS"]) == tile and d["WARP_SPLIT"] == groups
    assert (d["KV_STAGES"], d["KV_SPLIT"], d["WGMMA"]) == (stages, split, wgmma) and d["PACK_GQA"] == 4
    assert p.grid[0] * p.grid[1] * p.grid[2] == 8 * batch * split
    if split * 8 * batch == 256:
        assert 3 * (p.shared_mem + 1024) <= 233472


def test_v6_leaves_head_dim_128_and_short_keys_to_v5():
    """Head dim 128 keeps v5's split tiles; head dim 64 with parts under 2k keys (L2-resident K/V) keeps v4.1's."""
    from trt_fusedattn.plugins.attention import plan_decode
    for batch, lq, lkv in ((1, 1, 32768), (8, 4, 4096), (4, 16, 32768)):
        assert _decode(batch, lq, lkv).defines == _decode_v5(batch, lq, lkv)
    assert _decode(1, 1, 4096, dim=64).defines == _decode_v5(1, 1, 4096, dim=64)
    assert plan_decode.V6_HEAD_DIMS == (64,)


@pytest.mark.parametrize("batch, lq, lkv, dim", [(4, 1, 32768, 128), (4, 4, 131072, 128), (4, 8, 65536, 128),
                                                 (4, 1, 32768, 64), (4, 16, 131072, 64)])
def test_v7_three_groups_at_split_2_on_64_ctas(batch, lq, lkv, dim):
    """v7: 32 CTAs (batch 4 x 8 K/V heads) split 2 into 64 CTAs of >= 16k keys take three wgmma groups x two stages
    (one block an SM; clusters of 2), of 64-key tiles at head dim 128 (v5: split 4, one group on 128 CTAs) and of
    128-key tiles at head dim 64 (v6: split 8, one group of 64-key tiles on 256 CTAs)."""
    d = _decode(batch, lq, lkv, dim=dim, causal=int(lq > 1), causal_alignment="bottom_right").defines
    block_n = 64 if dim == 128 else 128
    assert (d["BLOCK_M"], d["BLOCK_N"], d["NUM_WARPS"], d["WARP_SPLIT"], d["KV_STAGES"]) == (64, block_n, 12, 3, 2)
    assert (d["KV_SPLIT"], d["WGMMA"], d["PACK_GQA"]) == (2, 1, 4)


@pytest.mark.parametrize("batch, lq", [(8, 1), (8, 4)])
def test_v7_head_dim_64_sixteen_rows_on_the_128_cta_grid_of_clusters_of_2(batch, lq):
    """v7 (head dim 64): <= 16 packed rows on v6's 128-CTA grid at split 2 take the 16-row mma.sync tile of four
    one-warp groups x 32-key tiles x five stages (one block an SM: 128 CTAs in clusters of 2 all fit at once)."""
    p = _decode(batch, lq, 4096, dim=64, causal=int(lq > 1), causal_alignment="bottom_right")
    d = p.defines
    assert (d["BLOCK_M"], d["BLOCK_N"], d["NUM_WARPS"], d["WARP_SPLIT"], d["KV_STAGES"]) == (16, 32, 4, 4, 5)
    assert (d["KV_SPLIT"], d["WGMMA"], d["Q_IN_REGISTERS"]) == (2, 0, 0) and p.shared_mem + 1024 <= 233472


def test_v7_leaves_the_rest_to_v6():
    """Split 8 (batch 1: the three-group tile lost 2.5-3.9% there on the H100), parts under 16k keys, 64 packed rows at
    head dim 64, and 128-CTA grids of 4- or 8-CTA clusters (a one-block-an-SM tile would need a second wave) keep v6."""
    from trt_fusedattn.plugins.attention import plan_decode
    from unittest import mock
    for batch, lq, lkv, dim in ((1, 1, 131072, 128), (1, 16, 131072, 128), (1, 1, 32768, 128), (4, 1, 16384, 128),
                                (8, 1, 4096, 128), (8, 16, 4096, 64), (4, 1, 8192, 64), (2, 1, 16384, 64)):
        with mock.patch.object(plan_decode, "V7_HEAD_DIMS", ()), mock.patch.object(plan_decode, "V7_MMA16_HEAD_DIMS", ()):
            v6 = _decode(batch, lq, lkv, dim=dim).defines
        assert _decode(batch, lq, lkv, dim=dim).defines == v6, (batch, lq, lkv, dim)


def _decode_v5(batch, lq, lkv, dim=128):
    """_decode's defines as v5's rule gives them (v6's head dims emptied)."""
    from unittest import mock
    from trt_fusedattn.plugins.attention import plan_decode
    with mock.patch.object(plan_decode, "V6_HEAD_DIMS", ()):
        return _decode(batch, lq, lkv, dim=dim).defines


def test_decode_tile_follows_the_grid():
    """On sm_90a at head dims 64 and 128 (wgmma): one group on 64-key tiles where the grid has two CTAs an SM without a
    split, on 128-key tiles at one, two groups for 64 rows on split grids; elsewhere (sm_80) mma.sync: 64 rows
    take one group of four warps on full grids and four groups of four warps (64x32, 16 warps) below; 16 rows take
    32-key tiles below 128 CTAs."""
    from trt_fusedattn.plugins.attention.plan_decode import (DECODE_TILES_FULL_GRID, DECODE_TILES_SMALL_GRID,
                                                             DECODE_TILES_WGMMA_NO_SPLIT)
    br = dict(causal=1, causal_alignment="bottom_right")
    (_, wgmma_full, _, _), (_, wgmma_fewer, _, _) = DECODE_TILES_WGMMA_NO_SPLIT
    for arch, dim, wgmma in (("sm_90a", 128, 1), ("sm_90a", 64, 1), ("sm_80", 128, 0)):
        for lq in (1, 16):
            full = _decode(batch=32, lq=lq, lkv=1024, arch=arch, dim=dim, **br).defines
            tile = wgmma_full if wgmma else DECODE_TILES_FULL_GRID[64][0] if lq == 16 else (16, 16, 4)
            assert (full["BLOCK_M"], full["BLOCK_N"], full["NUM_WARPS"], full["WGMMA"]) == tile[:3] + (wgmma,)
            assert full["KV_SPLIT"] == 1
        fewer = _decode(batch=16, lq=16, lkv=32768, arch=arch, dim=dim, **br).defines  # 128 CTAs
        expect = (wgmma_fewer[1], 4, 1, 1) if wgmma else (32, 16, 4, 1)
        assert (fewer["BLOCK_N"], fewer["NUM_WARPS"], fewer["WARP_SPLIT"], fewer["KV_SPLIT"]) == expect
    small = _decode(batch=1, lkv=4096).defines  # (parts of 512 keys: v5's split tiles need 2k)
    assert (small["BLOCK_M"], small["BLOCK_N"]) == DECODE_TILES_SMALL_GRID[16][0][:2] and small["KV_SPLIT"] == 8
    assert small["WGMMA"] == 0


def test_decode_split_and_packing_need_what_the_build_knows():
    """Packing needs static query length and head counts; the split also static batch and key length, and clusters
    (sm_90); prefill-length queries and head dims over 128 keep the general plan."""
    assert _decode(arch="sm_80", batch=4).defines["KV_SPLIT"] == 1 and _decode(arch="sm_80").defines["PACK_GQA"] == 4
    for general in (_decode(lq=17), _decode(lq=4096, causal=1), _decode(dim=256)):
        assert general.defines["PACK_GQA"] == 1 and general.defines["KV_SPLIT"] == 1
    b, lkv = Symbolic(4), Symbolic(32768)
    dynamic_keys = plan_attention([(b, 1, 32, 128), (b, lkv, 8, 128), (b, lkv, 8, 128), None, None],
                                  ["bfloat16"] * 3 + [None, None], FUSED_ATTENTION.resolve({}), "sm_90a")
    assert dynamic_keys.defines["PACK_GQA"] == 4 and dynamic_keys.defines["KV_SPLIT"] == 1
    assert dynamic_keys.grid[1] == 8 and int(dynamic_keys.grid[2]) == 4
    lq = Symbolic(1)
    dynamic_queries = plan_attention([(4, lq, 32, 128), (4, 32768, 8, 128), (4, 32768, 8, 128), None, None],
                                     ["bfloat16"] * 3 + [None, None], FUSED_ATTENTION.resolve({}), "sm_90a")
    assert dynamic_queries.defines["PACK_GQA"] == 1
    masked = _decode(batch=4, mask=(4, 32, 1, 32768))  # packing takes every mask: rows read their own head's
    assert masked.defines["PACK_GQA"] == 4 and masked.scalars[-4:] == (32 * 32768, 32768, 0, 1)


def test_packing_rejected_where_the_kernel_cannot_pack():
    shapes, dtypes = [(1, 1, 32, 128), (1, 4096, 8, 128), (1, 4096, 8, 128), None, None], ["bfloat16"] * 3 + [None] * 2
    for tuning in ({"WGMMA": 1, "WARP_SPECIALIZED": 1, "PACK_GQA": 4}, {"WGMMA": 0, "PACK_GQA": 2}):
        with pytest.raises(ValueError, match="PACK_GQA"):
            plan_attention(shapes, dtypes, FUSED_ATTENTION.resolve({}), "sm_90a", tuning=tuning)
    # a wgmma key group is one warpgroup of 64 rows (128 rows over two groups of 4 warps would be 32 rows a warp)
    for tuning in ({"WGMMA": 1, "WARP_SPLIT": 2}, {"WGMMA": 0, "BLOCK_M": 16, "NUM_WARPS": 4, "WARP_SPLIT": 2}):
        with pytest.raises(ValueError, match="WARP_SPLIT"):
            plan_attention(shapes, dtypes, FUSED_ATTENTION.resolve({}), "sm_90a", tuning=tuning)


def test_wgmma_decode_tile_holds_q_and_each_key_groups_stages():
    """64 packed rows on the wgmma mainloop: unpadded swizzled tiles, the Q tile and two K/V stages per key group
    (plus the 1024-byte alignment slack); the groups' partials fit over their own stages (no combine space)."""
    shapes, dtypes = [(1, 16, 32, 128), (1, 32768, 8, 128), (1, 32768, 8, 128), None, None], ["bfloat16"] * 3 + [None] * 2
    for groups in (1, 2, 3):
        tuning = {"WGMMA": 1, "BLOCK_M": 64, "BLOCK_N": 64, "NUM_WARPS": 4 * groups, "WARP_SPLIT": groups,
                  "PACK_GQA": 4, "KV_SPLIT": 8}
        plan = plan_attention(shapes, dtypes, FUSED_ATTENTION.resolve({}), "sm_90a", tuning=tuning)
        assert plan.shared_mem == (64 + groups * 2 * 2 * 64) * 128 * 2 + 1024 - 16
        assert plan.grid == (8, 8, 1) and plan.block == (128 * groups, 1, 1)


def test_key_groups_get_their_own_stages_and_combine_space():
    """WARP_SPLIT key groups each hold two K/V stages; a group's partials for the combine (fp32 O, a reference and a sum
    per row) go over its own stages where they fit, else after every group's stages (the combine weights stay in
    registers)."""
    pitch = 128 + 8
    rows64_16 = {"WGMMA": 0, "BLOCK_M": 64, "NUM_WARPS": 16, "WARP_SPLIT": 4, "BLOCK_N": 16, "PACK_GQA": 4}
    shapes = [(1, 16, 32, 128), (1, 32768, 8, 128), (1, 32768, 8, 128), None, None]
    for p, fits in ((_decode(batch=4, arch="sm_80"), True),  # the 16x16 tile of four groups
                    (plan_attention(shapes, ["bfloat16"] * 3 + [None] * 2, FUSED_ATTENTION.resolve({}), "sm_90a",
                                    tuning=rows64_16), False)):
        d = p.defines
        group_stages = 2 * d["BLOCK_N"] * 2 * pitch * 2
        partials = 4 * d["BLOCK_M"] * (128 + 2)
        assert d["WARP_SPLIT"] > 1 and (partials <= group_stages) == fits
        assert p.shared_mem == (d["BLOCK_M"] * pitch * 2 + d["WARP_SPLIT"] * group_stages
                                + (0 if fits else d["WARP_SPLIT"] * partials))


def test_head_dim_64_takes_64_row_tiles_at_four_blocks_an_sm_with_few_keys():
    """Head dim 64 on the single-role wgmma mainloop with <= WGMMA_SHORT_KEYS static keys and no mask (ViT-L, BERT
    with key lengths, SD cross attention): 64-row tiles at four blocks an SM; more keys, a mask, a softcap, a tuning or
    head dim 128 keep the 128-row tiles."""
    from trt_fusedattn.plugins.attention.plan import WGMMA_SHORT_KEYS

    def plan(lkv, dim=64, mask=None, attrs=None, tuning=None):
        return plan_attention([(32, 197, 16, dim), (32, lkv, 16, dim), (32, lkv, 16, dim), mask, None],
                              ["bfloat16"] * 3 + [None if mask is None else "bool", None],
                              FUSED_ATTENTION.resolve(attrs or {}), "sm_90a", tuning=tuning)
    for lkv in (77, 197, WGMMA_SHORT_KEYS):
        p = plan(lkv)
        assert (p.defines["BLOCK_M"], p.defines["NUM_WARPS"], p.defines["MIN_BLOCKS_PER_SM"]) == (64, 4, 4)
        assert p.defines["WGMMA"] == 1 and p.defines["WARP_SPECIALIZED"] == 0 and p.grid == (4, 16, 32)
    for p in (plan(WGMMA_SHORT_KEYS + 1), plan(197, mask=(32, 1, 1, 197)), plan(197, dim=128),
              plan(197, attrs={"softcap": 30.0}), plan(197, tuning={"WGMMA": 1})):
        assert p.defines["BLOCK_M"] >= 128  # (hd128 without causal masking: 192-row tiles)
