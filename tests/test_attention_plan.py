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
