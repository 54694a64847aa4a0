"""FusedConv launch plan (CPU): output sizes, grid, scalars, tile and kernel choice, symbolic dims, rejections."""
from __future__ import annotations

import math
import operator
from dataclasses import replace

import pytest

from _conv_cases import CASES, FP8_CASES, FP8_INPUT_SCALE, WGMMA_CASES, WS_CASES, X_E4M3_CASES, ConvCase, TunedCase
from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.plugins.conv import plan as conv_plan
from trt_fusedattn.launcher.arch import SHARED_LIMIT
from trt_fusedattn.plugins.conv.plan import (DEPTHWISE, GEMM_TILES, IMPLICIT_GEMM, IMPLICIT_GEMM_SM90,
                                             blocks_per_sm, float_literal, gemm_shared_bytes, output_shape_conv,
                                             plan_conv, wgmma_fits)


class Sym:
    """A stand-in for TensorRT's symbolic dims: + - * // build an expression; branching on one fails."""

    def __init__(self, fn):
        self.fn = fn

    @staticmethod
    def var(name):
        return Sym(lambda env: env[name])

    def __call__(self, env):
        return self.fn(env)

    def _op(self, other, op, swap=False):
        o = other if isinstance(other, Sym) else Sym(lambda env, v=other: v)
        a, b = (o, self) if swap else (self, o)
        return Sym(lambda env: op(a(env), b(env)))

    __add__ = lambda s, o: s._op(o, operator.add)          # noqa: E731
    __radd__ = lambda s, o: s._op(o, operator.add, True)   # noqa: E731
    __sub__ = lambda s, o: s._op(o, operator.sub)          # noqa: E731
    __rsub__ = lambda s, o: s._op(o, operator.sub, True)   # noqa: E731
    __mul__ = lambda s, o: s._op(o, operator.mul)          # noqa: E731
    __rmul__ = lambda s, o: s._op(o, operator.mul, True)   # noqa: E731
    __floordiv__ = lambda s, o: s._op(o, operator.floordiv)  # noqa: E731

    def _no(self, *_):
        raise AssertionError("the plan branched on a symbolic dimension")

    __bool__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __index__ = __int__ = _no
    __hash__ = object.__hash__


def _resolve(value, env):
    return value(env) if isinstance(value, Sym) else value


@pytest.mark.parametrize("case", CASES + FP8_CASES, ids=lambda c: c.name)
def test_plan_sizes_grid_and_scalars(case: ConvCase):
    plan = case.plan("sm_90a")
    p, q = case.out_hw
    assert plan.scalars == (case.n, case.h, case.w, case.c, case.k, p, q, case.pad, case.pad, case.c)
    pixels = case.n * p * q
    if case.groups == case.c and case.groups > 1:
        assert plan.source == DEPTHWISE and plan.block == (256, 1, 1)
        per_block = plan.defines["CHUNKS"] * plan.defines["DW_VEC"]
        block_pixels = 256 // plan.defines["CHUNKS"] * plan.defines["DW_PIX"]
        assert plan.grid == (math.ceil(pixels / block_pixels), math.ceil(case.k / per_block), 1)
    else:
        d = plan.defines
        ws = bool(d.get("WARP_SPECIALIZED"))
        assert plan.source == (IMPLICIT_GEMM_SM90 if ws else IMPLICIT_GEMM) and d["GROUPS"] == case.groups
        assert plan.grid == (math.ceil(pixels / d["BLOCK_M"]), math.ceil(case.k // case.groups / d["BLOCK_N"]),
                             case.groups * d.get("CLUSTER_K", 1))
        assert plan.block == (d["WARPS_M"] * d["WARPS_N"] * d["SPLIT_K"] * 32 + 128 * ws, 1, 1)
        w_row = case.kh * case.kw * case.c // case.groups  # FP8 16-byte W loads need 16-byte aligned rows
        assert d["IN_VEC"] == (8 if (case.c // case.groups) % 8 == 0 and not (case.fp8 and w_row % 16) else 1)
        assert d.get("FP8", 0) == case.fp8 and ("INPUT_SCALE" in d) == case.fp8
        assert (case.k // case.groups) % d["OUT_VEC"] == 0
        assert plan.shared_mem <= 227 * 1024
    assert plan.defines["HAS_RESIDUAL"] == case.residual and plan.defines["HAS_SHIFT"] == case.shift


def test_plan_with_symbolic_batch_and_spatial_dims_matches_ints():
    case = ConvCase("sym", 8, 64, 30, 22, 96, 3, 3, stride=2, pad=1, residual=True, post_activation="relu")
    n, h, w = Sym.var("n"), Sym.var("h"), Sym.var("w")
    shapes = case.shapes()
    shapes[0] = (n, 64, h, w)
    shapes[4] = (n, 96, Sym.var("p"), Sym.var("q"))
    sym_plan = plan_conv(shapes, case.dtypes(), case.attrs(), "sm_90a")
    int_plan = case.plan("sm_90a")
    env = {"n": case.n, "h": case.h, "w": case.w, "p": case.out_hw[0], "q": case.out_hw[1]}
    assert tuple(_resolve(g, env) for g in sym_plan.grid) == int_plan.grid
    assert tuple(_resolve(s, env) for s in sym_plan.scalars) == int_plan.scalars
    assert sym_plan.defines == int_plan.defines and sym_plan.block == int_plan.block


def test_one_dimensional_conv_maps_to_height_one():
    attrs = FUSED_CONV.resolve(dict(strides=[2], pads=[1, 2], dilations=[1]))
    plan = plan_conv([(4, 16, 37), (32, 5, 16), None, None, None], ["float16"] * 2 + [None] * 3, attrs, "sm_80")
    q = (37 + 3 - 4 - 1) // 2 + 1
    assert plan.scalars == (4, 1, 37, 16, 32, 1, q, 0, 1, 16)
    assert (plan.defines["KH"], plan.defines["KW"], plan.defines["STRIDE_W"]) == (1, 5, 2)


def test_tile_choice_by_channels():
    def tile(c, k, kernel, arch="sm_80"):
        d = ConvCase("t", 1, c, 8, 8, k, kernel, kernel).plan(arch).defines
        return d["BLOCK_M"], d["BLOCK_N"], d["SPLIT_K"], d["BLOCK_K"]
    # mma.sync (sm_80, and sm_90a where wgmma is not the default)
    assert tile(64, 64, 3) == (128, 64, 1, 64)
    assert tile(256, 256, 3) == (128, 64, 2, 64)      # deep reduction: two warp groups
    assert tile(960, 160, 1) == (128, 32, 1, 64)      # narrow 1x1 projection
    assert tile(512, 2048, 1) == (128, 128, 1, 32)    # wide 1x1 output
    assert tile(3, 32, 3) == (128, 32, 1, 32)
    assert tile(3, 32, 3, "sm_90a") == (128, 32, 1, 32)    # element gather: mma.sync on Hopper too
    assert tile(64, 32, 1, "sm_90a") == (128, 32, 1, 64)   # K/G <= 32: mma.sync's 128x32 is faster


def test_wgmma_tile_choice_by_channels(monkeypatch):
    monkeypatch.setattr(conv_plan, "FP16_WARP_SPECIALIZED_BY_DEFAULT", False)  # the unspecialized loop's rule

    def tile(c, k, kernel):
        d = ConvCase("t", 1, c, 8, 8, k, kernel, kernel).plan("sm_90a").defines
        return d["WGMMA"], d["BLOCK_M"], d["BLOCK_N"], d["WARPS_M"] * d["WARPS_N"], d.get("CLUSTER_K", 1)
    assert tile(64, 64, 3) == (1, 128, 64, 8, 1)
    assert tile(256, 256, 3) == (1, 128, 128, 8, 1)
    assert tile(512, 512, 3) == (1, 128, 128, 8, 2)      # few output tiles: the reduction over a 2-CTA cluster
    assert tile(1024, 512, 1) == (1, 128, 256, 8, 1)     # wide output over a deep reduction
    assert tile(960, 160, 1) == (1, 128, 128, 8, 1)


def test_pipeline_depth_fits_each_archs_shared_memory():
    case = ConvCase("deep", 1, 256, 7, 7, 128, 3, 3, pad=1)
    for arch in ("sm_80", "sm_89", "sm_90a"):
        plan = case.plan(arch)
        assert plan.shared_mem <= SHARED_LIMIT[arch] and plan.defines["STAGES"] >= 2
    assert case.plan("sm_89").defines["STAGES"] < case.plan("sm_90a").defines["STAGES"]


@pytest.mark.parametrize("case", CASES[:12], ids=lambda c: c.name)
def test_output_shape(case: ConvCase):
    assert output_shape_conv(case.shapes(), case.attrs()) == (case.n, case.k, *case.out_hw)


def test_output_shape_symbolic_and_one_dimensional():
    attrs = FUSED_CONV.resolve(dict(strides=[2], pads=[1, 1]))
    n, w = Sym.var("n"), Sym.var("w")
    shape = output_shape_conv([(n, 16, w), (32, 3, 16), None, None, None], attrs)
    env = {"n": 5, "w": 37}
    assert tuple(_resolve(d, env) for d in shape) == (5, 32, (37 + 2 - 3) // 2 + 1)


def test_tensorrt_formats_hwc8_accepted_when_it_is_nhwc():
    case = ConvCase("fmt", 2, 64, 8, 8, 32, 3, 3, pad=1, residual=True)
    formats = ("HWC8", "LINEAR", "LINEAR", None, "HWC8", "HWC8")
    assert plan_conv(case.shapes(), case.dtypes(), case.attrs(), "sm_90a", formats=formats) == case.plan("sm_90a")
    with pytest.raises(ValueError, match="HWC8"):
        plan_conv(case.shapes(), case.dtypes(), case.attrs(), "sm_90a",
                  formats=("LINEAR", "LINEAR", "LINEAR", None, "HWC8", "HWC8"))
    stem = ConvCase("stem", 1, 3, 16, 16, 64, 7, 7, stride=2, pad=3)
    padded = plan_conv(stem.shapes(), stem.dtypes(), stem.attrs(), "sm_90a",
                       formats=("HWC8", "LINEAR", "LINEAR", None, None, "HWC8"))
    dense = stem.plan("sm_90a")
    assert padded.scalars == dense.scalars[:-1] + (8,) and dense.scalars[-1] == 3  # X's pixel stride: 8 in HWC8
    assert padded.defines == dense.defines  # one PTX for both
    rgb = ConvCase("rgb", 1, 16, 8, 8, 3, 3, 3, pad=1)
    with pytest.raises(ValueError, match="output channels"):
        plan_conv(rgb.shapes(), rgb.dtypes(), rgb.attrs(), "sm_90a",
                  formats=("HWC8", "LINEAR", "LINEAR", None, None, "HWC8"))


def test_float_literal_is_exact_and_handles_infinity():
    assert float.fromhex(float_literal(0.1)) == 0.1
    assert float_literal(math.inf) == "__int_as_float(0x7f800000)"
    assert float_literal(-math.inf) == "__int_as_float(0xff800000)"


@pytest.mark.parametrize("change, message", [
    (dict(dtypes=["float32", "float32", None, None, None]), "float16 or bfloat16"),
    (dict(dtypes=["float16", "bfloat16", None, None, None]), "same dtype"),
    (dict(attrs=dict(input_scale=0.5)), "float8_e4m3fn W"),
    (dict(dtypes=["float16", "float8_e4m3fn", None, None, None]), "input_scale"),
    (dict(dtypes=["float32", "float8_e4m3fn", None, None, None], attrs=dict(input_scale=0.5)),
     "float16, bfloat16 or float8_e4m3fn X"),
    (dict(dtypes=["float8_e4m3fn", "float8_e4m3fn", None, None, None]), "input_scale"),
    (dict(shapes=[(1, 8, 8, 8), (8, 3, 3, 8), None, None, None], dtypes=["float8_e4m3fn", "float8_e4m3fn", None, None,
                                                                      None], attrs=dict(input_scale=0.5)),
     "multiple of 16"),
    (dict(shapes=[(1, 16, 8, 8), (8, 3, 3, 16), None, None, (1, 8, 6, 6)],
          dtypes=["float8_e4m3fn", "float8_e4m3fn", None, None, "float8_e4m3fn"], attrs=dict(input_scale=0.5)),
     "computed in, float16"),
    (dict(attrs=dict(output_scale=-0.5)), "output_scale must be a positive"),
    (dict(attrs=dict(output_scale=0.5), arch="sm_80"), "sm_89 or newer"),
    (dict(shapes=[(1, 8, 8, 8), (8, 3, 3, 8), None, None, (1, 8, 6, 6)],  # an FP8 producer adds a 16-bit residual
          dtypes=["float16", "float16", None, None, "float8_e4m3fn"], attrs=dict(output_scale=0.5)), "computed in"),
    (dict(dtypes=["float16", "float8_e4m3fn", None, None, None], attrs=dict(input_scale=-1.0)), "positive"),
    (dict(dtypes=["float16", "float8_e4m3fn", None, None, None], attrs=dict(input_scale=0.5), arch="sm_80"),
     "sm_89"),
    (dict(shapes=[(1, 16, 8, 8), (16, 3, 3, 1), None, None, None],
          dtypes=["float16", "float8_e4m3fn", None, None, None], attrs=dict(input_scale=0.5, group=16)), "depthwise"),
    (dict(shapes=[(1, 8, 4, 4, 4), (8, 1, 1, 1, 8), None, None, None]), "1-D or 2-D"),
    (dict(shapes=[(1, 16, 8, 8), (6, 3, 3, 4), None, None, None], attrs=dict(group=4)), "multiple of group"),
    (dict(shapes=[(1, 12, 8, 8), (8, 3, 3, 8), None, None, None]), "needs 8"),
    (dict(shapes=[(1, 8, 8, 8), (Sym.var("k"), 3, 3, 8), None, None, None]), "static"),
    (dict(shapes=[(1, 8, 8, 8), (8, 3, 3, 8), (8,), None, None], dtypes=["float16", "float16", "float16", None, None]),
     "float32"),
    (dict(shapes=[(1, 8, 8, 8), (8, 3, 3, 8), (7,), None, None], dtypes=["float16", "float16", "float32", None, None]),
     "7 entries"),
    (dict(shapes=[(1, 8, 8, 8), (8, 3, 3, 8), None, None, (1, 8, 6, 6)],
          dtypes=["float16", "float16", None, None, "float32"]), "residual"),
    (dict(attrs=dict(strides=[0, 1])), ">= 1"),
])
def test_plan_rejects_what_no_kernel_serves(change, message):
    shapes = change.get("shapes", [(1, 8, 8, 8), (8, 3, 3, 8), None, None, None])
    dtypes = change.get("dtypes", ["float16", "float16", None, None, None])
    attrs = FUSED_CONV.resolve(change.get("attrs", {}))
    with pytest.raises(ValueError, match=message):
        plan_conv(shapes, dtypes, attrs, change.get("arch", "sm_90a"))


@pytest.mark.parametrize("arch", ["sm_89", "sm_90a", "sm_100a", "sm_120"])
def test_fp8_plan_accepted_from_sm_89(arch):
    case = FP8_CASES[1]
    plan = case.plan(arch)
    d = plan.defines
    assert d["FP8"] == 1 and float.fromhex(d["INPUT_SCALE"]) == FP8_INPUT_SCALE
    assert float.fromhex(d["INPUT_SCALE_INV"]) == 1 / FP8_INPUT_SCALE
    a8_tiles = 3 if d.get("WGMMA") else 2  # quantized A tiles: wgmma keeps one more in use
    assert d["STAGES"] >= 3 + d.get("WGMMA", 0)
    assert plan.shared_mem == d["STAGES"] * (d["BLOCK_M"] * 2 + d["BLOCK_N"]) * d["BLOCK_K"] + \
        a8_tiles * d["BLOCK_M"] * d["BLOCK_K"]


def test_fp8_split_tile_drops_its_split_where_shared_memory_is_small():
    case = next(c for c in FP8_CASES if c.name == "fp8_3x3_c256_k128_split")
    assert case.plan("sm_90a", mma="mma.sync").defines["SPLIT_K"] == 2
    plan = case.plan("sm_89")
    assert plan.defines["SPLIT_K"] == 1 and plan.shared_mem <= 101376


def test_fp8_wgmma_only_where_the_kernel_has_it():
    vector = next(c for c in FP8_CASES if c.name == "fp8_3x3_c64_k64_17x13")
    gather = next(c for c in FP8_CASES if c.name == "fp8_3x3_c5_k7_odd")
    assert vector.plan("sm_90a", mma="wgmma").defines["WGMMA"] == 1
    assert "WGMMA" not in vector.plan("sm_90a", mma="mma.sync").defines
    assert "WGMMA" not in vector.plan("sm_89", mma="wgmma").defines      # Ada: mma.sync e4m3 is native there
    assert "WGMMA" not in gather.plan("sm_90a", mma="wgmma").defines     # element gather: mma.sync
    assert CASES[0].plan("sm_90a", mma="wgmma").defines["WGMMA"] == 1     # float16 too
    assert "WGMMA" not in CASES[0].plan("sm_90a", mma="mma.sync").defines
    with pytest.raises(ValueError, match="mma="):
        vector.plan("sm_90a", mma="tcgen05")


def test_e4m3_x_moves_bytes_and_writes_float16():
    """float8_e4m3fn X (already quantized): no quantize pass (A stages hold bytes), float16 Y, BLOCK_K 128 over
    >= 256 channels on the wgmma path; by default (sm_90a) on the warp-specialized kernel with the same stages."""
    case = ConvCase("x8", 2, 256, 7, 7, 256, 3, 3, pad=1, input_scale=FP8_INPUT_SCALE)
    dtypes = ["float8_e4m3fn", *case.dtypes()[1:]]
    plan = plan_conv(case.shapes(), dtypes, case.attrs(), "sm_90a", mma="wgmma")
    d = plan.defines
    assert d["X_E4M3"] == 1 and d["WGMMA"] == 1 and d["DTYPE_BF16"] == 0 and d["BLOCK_K"] == 128
    assert plan.shared_mem == d["STAGES"] * (d["BLOCK_M"] + d["BLOCK_N"]) * d["BLOCK_K"]
    ws = plan_conv(case.shapes(), dtypes, case.attrs(), "sm_90a")
    w = ws.defines
    assert ws.kernel == "fused_conv_implicit_gemm_sm90" and w["X_E4M3"] == 1 and w["BLOCK_K"] == 128
    ring = w["STAGES"] * (w["BLOCK_M"] + w["BLOCK_N"]) * w["BLOCK_K"]  # one byte per operand element
    pushed = (w["CLUSTER_K"] - 1) * math.ceil(w["BLOCK_M"] // 16 / w["CLUSTER_K"]) * 16 * w["BLOCK_N"] * 4
    assert w["PUSHED_OFFSET"] == ring and ws.shared_mem == 1024 + ring + pushed  # cluster sums past the ring
    x8 = plan_conv(case.shapes(), dtypes, case.attrs(), "sm_90a", block_k=64, mma="wgmma")
    quantized = plan_conv(case.shapes(), case.dtypes(), case.attrs(), "sm_90a", block_k=64)
    q = quantized.defines
    assert "X_E4M3" not in q and q["STAGES"] == x8.defines["STAGES"]
    assert quantized.shared_mem - x8.shared_mem == q["STAGES"] * q["BLOCK_M"] * 64 + 3 * q["BLOCK_M"] * 64


# --- Hopper main loops and reduction splits: wgmma (every dtype), thread-block clusters, taps-inner order ---

def test_every_gemm_tile_but_non_warpgroup_shapes_fits_wgmma():
    """wgmma_fits: whole warpgroups (4 warps), each over a multiple of 64 rows, 32..256 columns. Every tile in
    GEMM_TILES has that shape; made-up tiles without it are refused."""
    for name, (block_m, block_n, warps_m, warps_n, _) in GEMM_TILES.items():
        warps = warps_m * warps_n
        expected = warps % 4 == 0 and (block_m // (warps // 4)) % 64 == 0 and block_n in (32, 64, 128, 256)
        assert wgmma_fits(name) == expected, name
    assert all(wgmma_fits(name) for name in GEMM_TILES)


@pytest.mark.parametrize("tile, shape", [("64x64w2", (64, 64, 1, 2, 1)),      # half a warpgroup
                                         ("64x128w8", (64, 128, 2, 4, 1)),    # 32 rows per warpgroup
                                         ("128x96w4", (128, 96, 2, 2, 1))])   # 96 columns: no such wgmma here
def test_tile_without_whole_warpgroups_falls_back_to_mma_sync(monkeypatch, tile, shape):
    monkeypatch.setitem(GEMM_TILES, tile, shape)
    assert not wgmma_fits(tile)
    case = ConvCase("t", 2, 64, 9, 9, 64, 3, 3, pad=1)
    for c in (case, replace(case, dtype="bfloat16"), replace(case, scale=True, input_scale=FP8_INPUT_SCALE)):
        d = c.plan("sm_90a", tile=tile, mma="wgmma").defines
        assert "WGMMA" not in d and d["BLOCK_M"] == shape[0] and d["BLOCK_N"] == shape[1]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("tile", ["128x128w8", "128x256w8", "64x128w4", "128x64w4", "64x256w4", "128x64w8",
                                  "128x128w8s2", "64x128w4s2", "128x32w4"])
def test_fp16_wgmma_on_warpgroup_tiles_only_on_sm90a(dtype, tile):
    case = ConvCase("t", 2, 64, 9, 9, 96, 3, 3, pad=1, dtype=dtype)
    plan = case.plan("sm_90a", tile=tile, mma="wgmma")
    d = plan.defines
    assert d["WGMMA"] == 1 and d["DTYPE_BF16"] == (dtype == "bfloat16") and "FP8" not in d
    assert (d["BLOCK_M"], d["BLOCK_N"], d["WARPS_M"], d["WARPS_N"], d["SPLIT_K"]) == GEMM_TILES[tile]
    assert plan.shared_mem == gemm_shared_bytes(d) <= SHARED_LIMIT["sm_90a"]
    assert "WGMMA" not in case.plan("sm_90a", tile=tile, mma="mma.sync").defines
    assert ("WGMMA" in case.plan("sm_90a", tile=tile).defines) == conv_plan.FP16_WGMMA_BY_DEFAULT
    for arch in ("sm_80", "sm_89", "sm_90"):  # no wgmma below sm_90a (plain sm_90 lacks the 'a' features)
        try:
            assert "WGMMA" not in case.plan(arch, tile=tile, mma="wgmma").defines
        except ValueError as exc:  # a tile too large for sm_89's shared memory
            assert "shared memory" in str(exc) and arch != "sm_90"


@pytest.mark.parametrize("default", [False, True])
def test_fp16_wgmma_default_follows_its_switch(monkeypatch, default):
    case = ConvCase("t", 2, 64, 9, 9, 96, 3, 3, pad=1)
    monkeypatch.setattr(conv_plan, "FP16_WGMMA_BY_DEFAULT", default)
    assert ("WGMMA" in case.plan("sm_90a", tile="128x128w8").defines) == default
    assert ("WGMMA" in case.plan("sm_90a").defines) == default
    assert case.plan("sm_90a", tile="128x128w8", mma="wgmma").defines["WGMMA"] == 1
    assert "WGMMA" not in case.plan("sm_90a", tile="128x128w8", mma="mma.sync").defines
    assert "WGMMA" not in case.plan("sm_89", tile="128x64w4").defines


def test_fp16_wgmma_needs_16_byte_loads():
    gather = ConvCase("t", 2, 12, 9, 9, 64, 3, 3, pad=1)  # C % 8 != 0: the element gather
    d = gather.plan("sm_90a", tile="128x64w4", mma="wgmma").defines
    assert d["IN_VEC"] == 1 and "WGMMA" not in d


def test_unknown_tile_and_main_loop_rejected():
    case = ConvCase("t", 2, 64, 9, 9, 64, 3, 3, pad=1)
    with pytest.raises(ValueError, match="unknown implicit-GEMM tile"):
        case.plan("sm_90a", tile="256x256w16")
    with pytest.raises(ValueError, match="mma="):
        case.plan("sm_90a", mma="hmma")


@pytest.mark.parametrize("cluster", [2, 4])
@pytest.mark.parametrize("tile, groups", [("128x128w8", 1), ("64x128w4", 2), ("128x128w8s2", 1),
                                          ("64x128w4s2", 4)])
@pytest.mark.parametrize("mma", ["wgmma", "mma.sync"])
def test_cluster_splits_the_reduction_along_grid_z(cluster, tile, groups, mma):
    case = ConvCase("t", 3, 64 * groups, 9, 7, 96 * groups, 3, 3, pad=1, groups=groups, residual=True)
    plan = case.plan("sm_90a", tile=tile, mma=mma, cluster=cluster)
    d = plan.defines
    pixels = case.n * case.out_hw[0] * case.out_hw[1]
    assert d["CLUSTER_K"] == cluster and ("WGMMA" in d) == (mma == "wgmma")
    assert plan.grid == (math.ceil(pixels / d["BLOCK_M"]), math.ceil(96 / d["BLOCK_N"]), groups * cluster)
    assert plan.shared_mem == gemm_shared_bytes(d) >= d["BLOCK_M"] * d["BLOCK_N"] * 4
    assert plan.shared_mem >= d["SPLIT_K"] * d["STAGES"] * (d["BLOCK_M"] + d["BLOCK_N"]) * d["BLOCK_K"] * 2
    no_cluster = case.plan("sm_90a", tile=tile, mma=mma)
    assert "CLUSTER_K" not in no_cluster.defines and no_cluster.grid[2] == groups
    assert case.plan("sm_90a", tile=tile, mma=mma, cluster=1).defines == no_cluster.defines


def test_fp8_tuned_cases_carry_the_weight_scale():
    """A tuned FP8 case's plan is launched with the e4m3 W's per-channel scale (test_conv_gpu.check_plan passes it):
    its plan must take one (a plan without would read the residual from the scale's slot)."""
    for tuned in WGMMA_CASES + WS_CASES:
        if tuned.case.fp8:
            assert tuned.case.scale and tuned.plan("sm_90a").defines["HAS_SCALE"] == 1, tuned.name


def test_unspecialized_cluster_sums_past_the_ring_where_the_sm_keeps_its_blocks(monkeypatch):
    """The unspecialized wgmma loop's cluster ranks push their sums past the ring (PUSHED_OFFSET from the shared memory's
    start, after the stages and the staged tile) where that leaves the ring's depth and the blocks an SM holds by shared
    memory as they were; else in the ring's bytes. The tested wgmma cluster cases take both."""
    kinds = set()
    clustered = [t for t in WGMMA_CASES if "cluster" in t.overrides]
    past = [t.plan("sm_90a").defines for t in clustered]
    monkeypatch.setattr(conv_plan, "PUSHED_PAST_RING_UNSPECIALIZED", False)
    for d, in_ring in zip(past, [t.plan("sm_90a").defines for t in clustered]):
        kinds.add("PUSHED_OFFSET" in d)
        assert "PUSHED_OFFSET" not in in_ring and {k: v for k, v in d.items() if k != "PUSHED_OFFSET"} == in_ring
        if "PUSHED_OFFSET" in d:
            assert d["PUSHED_OFFSET"] == gemm_shared_bytes({**d, "CLUSTER_K": 1})
            assert blocks_per_sm(d, "sm_90a") == blocks_per_sm(in_ring, "sm_90a")
        else:
            assert blocks_per_sm({**d, "PUSHED_OFFSET": gemm_shared_bytes({**d, "CLUSTER_K": 1})}, "sm_90a") \
                < blocks_per_sm(d, "sm_90a")
    assert kinds == {True, False}


def test_cluster_partial_tile_can_set_the_shared_memory(monkeypatch):
    """A shallow pipeline (1x1 over 32 channels: one BLOCK_K 32 tile) on a wide tile: the staged output tile (padded
    rows of 2-byte elements) followed by the fp32 partial sums the other rank pushes for this CTA's half of the rows
    is the largest use of shared memory; past the ring (the default where the SM keeps its blocks) the sums follow
    the larger of the ring and the staged tile."""
    case = ConvCase("t", 2, 32, 9, 9, 256, 1, 1)
    staged, pushed = 128 * (256 + 8) * 2, 64 * 256 * 4
    plan = case.plan("sm_90a", tile="128x256w8", mma="wgmma", cluster=2)
    d = plan.defines
    ring = d["STAGES"] * (128 + 256) * 32 * 2
    assert d["BLOCK_K"] == 32 and d["CLUSTER_K"] == 2
    assert d["PUSHED_OFFSET"] == max(ring, staged) and plan.shared_mem == max(ring, staged) + pushed
    assert case.plan("sm_90a", tile="128x256w8", mma="wgmma").shared_mem < plan.shared_mem
    monkeypatch.setattr(conv_plan, "PUSHED_PAST_RING_UNSPECIALIZED", False)
    for mma in ("wgmma", "mma.sync"):  # mma.sync keeps the sums in the ring's bytes by default too
        plan = case.plan("sm_90a", tile="128x256w8", mma=mma, cluster=2)
        assert "PUSHED_OFFSET" not in plan.defines and plan.defines["CLUSTER_K"] == 2
        assert plan.shared_mem == staged + pushed > plan.defines["STAGES"] * (128 + 256) * 32 * 2
        assert case.plan("sm_90a", tile="128x256w8", mma=mma).shared_mem < plan.shared_mem


def test_cluster_stages_count_each_ctas_slice():
    """Pipeline depth is clamped to the reduction tiles one CTA walks (9 tiles: 5 on 2 CTAs, 3 on 4)."""
    case = ConvCase("t", 2, 64, 9, 9, 64, 3, 3, pad=1)
    assert case.plan("sm_90a", tile="128x64w4", mma="mma.sync", stages=8).defines["STAGES"] == 8
    assert case.plan("sm_90a", tile="128x64w4", mma="mma.sync", stages=8, cluster=4).defines["STAGES"] == 3
    assert case.plan("sm_90a", tile="128x64w4", mma="wgmma", stages=8, cluster=4).defines["STAGES"] == 4


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89"])
def test_cluster_needs_sm90(arch):
    case = ConvCase("t", 2, 64, 9, 9, 64, 3, 3, pad=1)
    with pytest.raises(ValueError, match="cluster"):
        case.plan(arch, cluster=2)
    fp8 = replace(case, scale=True, input_scale=FP8_INPUT_SCALE)
    if arch == "sm_89":  # FP8's own arch check comes first below sm_89
        with pytest.raises(ValueError, match="cluster"):
            fp8.plan(arch, cluster=4)
    assert "CLUSTER_K" in case.plan("sm_90", cluster=2).defines  # plain sm_90 has clusters (not wgmma)
    assert "CLUSTER_K" in case.plan("sm_100a", cluster=2).defines


def test_taps_inner_plan_and_rejections():
    case = ConvCase("t", 2, 128, 9, 9, 64, 3, 3, pad=1)
    d = case.plan("sm_90a", taps_inner=True).defines
    assert d["TAPS_INNER"] == 1 and 128 % d["BLOCK_K"] == 0
    assert "TAPS_INNER" not in case.plan("sm_90a").defines
    assert case.plan("sm_80", taps_inner=True).defines["TAPS_INNER"] == 1  # cp.async.ca: any arch
    with pytest.raises(ValueError, match="taps_inner"):  # 1x1: nothing to reorder
        ConvCase("t", 2, 128, 9, 9, 64, 1, 1).plan("sm_90a", taps_inner=True)
    with pytest.raises(ValueError, match="taps_inner"):  # C/G = 96 with BLOCK_K 64
        ConvCase("t", 2, 96, 9, 9, 64, 3, 3, pad=1).plan("sm_90a", tile="128x64w4", block_k=64, taps_inner=True)
    with pytest.raises(ValueError, match="taps_inner"):  # C/G = 48: BLOCK_K 32 does not divide it either
        ConvCase("t", 2, 48, 9, 9, 64, 3, 3, pad=1).plan("sm_90a", taps_inner=True)
    with pytest.raises(ValueError, match="taps_inner"):  # groups: C/G = 16
        ConvCase("t", 2, 64, 9, 9, 64, 3, 3, pad=1, groups=4).plan("sm_90a", taps_inner=True)
    with pytest.raises(ValueError, match="taps_inner"):  # FP8: BLOCK_K 64, C/G 32
        ConvCase("t", 2, 32, 9, 9, 64, 3, 3, pad=1, scale=True, input_scale=FP8_INPUT_SCALE).plan(
            "sm_90a", taps_inner=True)
    # C/G = 96 is a multiple of BLOCK_K 32 (its default)
    assert ConvCase("t", 2, 96, 9, 9, 64, 3, 3, pad=1).plan("sm_90a", taps_inner=True).defines["BLOCK_K"] == 32


def test_fp8_wgmma_shared_memory_holds_three_quantized_a_tiles():
    case = next(c for c in FP8_CASES if c.name == "fp8_3x3_c64_k64_17x13")
    for tile in ("128x128w8", "64x128w4", "128x64w8"):
        wg = case.plan("sm_90a", tile=tile, mma="wgmma", stages=4)
        sync = case.plan("sm_90a", tile=tile, mma="mma.sync", stages=4)
        d = wg.defines
        assert d["WGMMA"] == 1 and "WGMMA" not in sync.defines and d["STAGES"] == sync.defines["STAGES"] == 4
        a8 = d["BLOCK_M"] * d["BLOCK_K"]  # one e4m3 A tile
        assert wg.shared_mem == 4 * (d["BLOCK_M"] * 2 + d["BLOCK_N"]) * d["BLOCK_K"] + 3 * a8
        assert wg.shared_mem - sync.shared_mem == a8
        assert gemm_shared_bytes({**sync.defines, "WGMMA": 1}) == wg.shared_mem
    # float16 under wgmma: no quantized tiles, same bytes as mma.sync
    fp16 = ConvCase("t", 2, 64, 9, 9, 64, 3, 3, pad=1)
    wg, sync = (fp16.plan("sm_90a", tile="128x128w8", mma=m, stages=4) for m in ("wgmma", "mma.sync"))
    assert wg.shared_mem == sync.shared_mem == 4 * (128 + 128) * 64 * 2


@pytest.mark.parametrize("fp8, mma, least", [(False, "mma.sync", 2), (False, "wgmma", 3), (True, "mma.sync", 3),
                                              (True, "wgmma", 4)])
@pytest.mark.parametrize("tile", ["128x128w8", "64x128w4", "64x128w4s2"])
def test_min_pipeline_depth(fp8, mma, least, tile):
    """wgmma keeps one tile's MMAs in flight (+1 stage); FP8 quantizes A one tile ahead (+1): the requested depth
    and a short reduction (1x1 over 64 channels: one tile) never go below that."""
    for c, kernel in ((64, 1), (64, 3)):
        case = ConvCase("t", 2, c, 9, 9, 64, kernel, kernel, pad=kernel // 2, scale=fp8,
                        input_scale=FP8_INPUT_SCALE if fp8 else 0.0)
        for stages in (None, 2):
            d = case.plan("sm_90a", tile=tile, mma=mma, stages=stages).defines
            assert ("WGMMA" in d) == (mma == "wgmma")
            assert d["STAGES"] >= least
            if stages == 2 or kernel == 1:
                assert d["STAGES"] == least


@pytest.mark.parametrize("tuned", WGMMA_CASES, ids=lambda t: t.name)
def test_wgmma_case_plans(tuned: TunedCase):
    plan = tuned.plan("sm_90a")
    d, case = plan.defines, tuned.case
    assert plan.source == IMPLICIT_GEMM and d["WGMMA"] == 1 and d["IN_VEC"] == 8
    assert d.get("FP8", 0) == case.fp8 and d["DTYPE_BF16"] == (case.dtype == "bfloat16")
    assert (d["BLOCK_M"], d["BLOCK_N"], d["WARPS_M"], d["WARPS_N"], d["SPLIT_K"]) == GEMM_TILES[tuned.overrides["tile"]]
    assert d.get("CLUSTER_K", 1) == tuned.overrides.get("cluster", 1)
    assert d.get("TAPS_INNER", 0) == bool(tuned.overrides.get("taps_inner"))
    assert plan.shared_mem == gemm_shared_bytes(d) <= 232448
    p, q = case.out_hw
    m_tiles = math.ceil(case.n * p * q / d["BLOCK_M"])
    assert plan.grid == (m_tiles + m_tiles % 2 if d.get("SHARE_W") else m_tiles,  # share_w: whole M-tile pairs
                         math.ceil(case.k // case.groups / d["BLOCK_N"]), case.groups * d.get("CLUSTER_K", 1))
    assert d.get("SHARE_W", 0) == int(bool(tuned.overrides.get("share_w")))
    assert plan.block == (d["WARPS_M"] * d["WARPS_N"] * d["SPLIT_K"] * 32, 1, 1)
    assert d["STAGES"] >= 3 + case.fp8


def test_wgmma_cases_cover_what_they_claim():
    """Odd M (not a multiple of BLOCK_M), K/G not a multiple of BLOCK_N, uneven cluster slices, every new tile."""
    plans = [(t, t.plan("sm_90a").defines) for t in WGMMA_CASES]
    m = lambda t: t.case.n * t.case.out_hw[0] * t.case.out_hw[1]  # noqa: E731
    assert any(m(t) % d["BLOCK_M"] for t, d in plans) and any(m(t) > 2 * d["BLOCK_M"] for t, d in plans)
    assert any((t.case.k // t.case.groups) % d["BLOCK_N"] for t, d in plans)
    tiles = lambda t, d: math.ceil(t.case.kh * t.case.kw * t.case.c // t.case.groups / d["BLOCK_K"])  # noqa: E731
    assert any(tiles(t, d) % d["CLUSTER_K"] for t, d in plans if "CLUSTER_K" in d)
    assert {"64x256w4", "128x64w8", "128x128w8s2", "64x128w4s2"} <= {t.overrides["tile"] for t in WGMMA_CASES}
    assert {t.case.dtype for t in WGMMA_CASES} == {"float16", "bfloat16"} and any(t.case.fp8 for t in WGMMA_CASES)
    assert len({t.name for t in WGMMA_CASES}) == len(WGMMA_CASES)


@pytest.mark.parametrize("tuned", WS_CASES, ids=lambda t: t.name)
def test_warp_specialized_case_plans(tuned: TunedCase):
    """mma="wgmma_ws": the sm90 source with a 128-thread load warpgroup beside the tile's 8 MMA warps (a warpgroup per
    64 rows on 192- and 64-row tiles: 12, 4), the ring's 1 KB of barriers before the stages, a ring as deep as fits
    (<= 6) and the reduction needs, the same grid."""
    plan = tuned.plan("sm_90a")
    d, case = plan.defines, tuned.case
    assert plan.source == IMPLICIT_GEMM_SM90 and plan.kernel == "fused_conv_implicit_gemm_sm90"
    warps = {192: 12, 64: 4}.get(d["BLOCK_M"], 8)
    assert d["WARP_SPECIALIZED"] == 1 and d["WGMMA"] == 1 and d["SPLIT_K"] == 1 and d["WARPS_M"] * d["WARPS_N"] == warps
    assert plan.block == (128 + 32 * warps, 1, 1)
    ctas = d.get("WS_CTAS", 1)  # blocks per SM: each within its share of the SM's shared memory
    limit = 232448 // ctas - 1024 * (ctas - 1)
    assert ctas == tuned.overrides.get("ws_ctas", 1) and plan.shared_mem == gemm_shared_bytes(d) <= limit
    stage = (d["BLOCK_M"] + d["BLOCK_N"]) * d["BLOCK_K"] * (1 if case.x_e4m3 else 2)  # operand bytes
    assert plan.shared_mem >= 1024 + d["STAGES"] * stage
    if "PUSHED_OFFSET" in d:  # the cluster sums past the ring and the staged tile
        assert d.get("CLUSTER_K", 1) > 1 and d["PUSHED_OFFSET"] >= max(d["STAGES"] * stage, d["BLOCK_M"] * (d["BLOCK_N"] + 8) * 2)
    tiles = math.ceil(case.kh * case.kw * case.c // case.groups / d["BLOCK_K"] / d.get("CLUSTER_K", 1))
    assert 3 <= d["STAGES"] <= max(3, min(tuned.overrides.get("stages", 6), tiles + 1))
    assert plan.shared_mem + stage > limit or d["STAGES"] == max(3, min(tuned.overrides.get("stages", 6), tiles + 1))
    p, q = case.out_hw
    m_tiles = math.ceil(case.n * p * q / d["BLOCK_M"])
    assert plan.grid == (m_tiles + m_tiles % 2 if d.get("SHARE_W") else m_tiles,  # share_w: whole M-tile pairs
                         math.ceil(case.k // case.groups / d["BLOCK_N"]), case.groups * d.get("CLUSTER_K", 1))
    assert d.get("SHARE_W", 0) == int(bool(tuned.overrides.get("share_w")))


def test_warp_specialized_cases_cover_what_they_claim():
    """Every 8-warp tile (256x64 among them), the 12-warp 192x128 and the 4-warp 64-row tiles, BLOCK_K 32 and 64, both
    dtypes, odd M, K/G not a multiple of BLOCK_N, a cluster CTA with no reduction tile, the shallowest ring; the 64-row
    tiles with odd M, two blocks per SM, clusters and e4m3 X."""
    plans = [(t, t.plan("sm_90a").defines) for t in WS_CASES]
    assert {t.overrides["tile"] for t in WS_CASES} == {"128x128w8", "128x256w8", "256x128w8", "128x64w8", "192x128w12",
                                                       "256x64w8", "64x64w4", "64x128w4", "64x256w4"}
    one = [(t, d) for t, d in plans if d["BLOCK_M"] == 64]
    assert all(t.plan("sm_90a").block == (256, 1, 1) for t, _ in one) and any(t.case.x_e4m3 for t, _ in one)
    assert {d.get("CLUSTER_K", 1) for _, d in one} == {1, 3, 4} and any(d.get("WS_CTAS") == 2 for _, d in one)
    assert {d["BLOCK_K"] for _, d in plans} == {32, 64, 128} and {t.case.dtype for t in WS_CASES} == {"float16", "bfloat16"}
    assert {d.get("CLUSTER_K", 1) for _, d in plans} == {1, 2, 3, 4} and any(t.case.x_e4m3 for t in WS_CASES)
    m = lambda t: t.case.n * t.case.out_hw[0] * t.case.out_hw[1]  # noqa: E731
    assert any(m(t) % d["BLOCK_M"] for t, d in plans) and any(m(t) > 2 * d["BLOCK_M"] for t, d in plans)
    assert any((t.case.k // t.case.groups) % d["BLOCK_N"] for t, d in plans)
    assert any(m(t) % 64 and m(t) > 128 for t, _ in one)
    tiles = lambda t, d: math.ceil(t.case.kh * t.case.kw * t.case.c // t.case.groups / d["BLOCK_K"])  # noqa: E731
    assert any(tiles(t, d) < d["CLUSTER_K"] for t, d in plans if "CLUSTER_K" in d)
    for ctas in (1, 2):  # cluster sums past the ring and in its bytes (no room past it), one and two blocks per SM
        assert {"PUSHED_OFFSET" in d for _, d in plans if "CLUSTER_K" in d and d.get("WS_CTAS", 1) == ctas} == {True, False}
    assert any(d["STAGES"] == 3 for _, d in plans) and len({t.name for t in WS_CASES}) == len(WS_CASES)
    shared = [(t, d) for t, d in plans if d.get("SHARE_W")]
    assert {d["BLOCK_N"] for _, d in shared} == {64, 128, 256} and {d["BLOCK_K"] for _, d in shared} == {32, 64}
    assert any(math.ceil(m(t) / d["BLOCK_M"]) % 2 for t, d in shared) and any(tiles(t, d) == 1 for t, d in shared)
    assert any(d["STAGES"] == 3 for _, d in shared) and any((t.case.k // t.case.groups) % d["BLOCK_N"]
                                                            for t, d in shared)


def test_share_w_rejections():
    """share_w pairs warp-specialized M tiles in a 2-CTA cluster: not with a cluster split, two blocks per SM, or
    another main loop."""
    case = ConvCase("t", 2, 64, 9, 9, 64, 3, 3, pad=1)
    for overrides in (dict(mma="wgmma_ws", tile="128x128w8", cluster=2),
                      dict(mma="wgmma_ws", tile="128x64w8", ws_ctas=2), dict(mma="wgmma", tile="128x128w8")):
        with pytest.raises(ValueError, match="share_w"):
            case.plan("sm_90a", share_w=True, **overrides)


@pytest.mark.parametrize("arch, dtypes, tile, message", [
    ("sm_89", None, "128x128w8", "sm_90a"),
    ("sm_90a", "fp8", "128x128w8", "FP8"),
    ("sm_90a", None, "128x64w4", "8-warp"),  # 4 warps on 128 rows: only the 64-row tiles run on one warpgroup
    ("sm_90a", None, "128x128w8s2", "8-warp"),
])
def test_warp_specialized_rejections(arch, dtypes, tile, message):
    case = ConvCase("t", 2, 64, 9, 9, 64, 3, 3, pad=1)
    if dtypes == "fp8":
        case = replace(case, scale=True, input_scale=FP8_INPUT_SCALE)
    with pytest.raises(ValueError, match=message):
        case.plan(arch, mma="wgmma_ws", tile=tile)
    with pytest.raises(ValueError, match="C/G = 12"):
        ConvCase("t", 2, 12, 9, 9, 64, 3, 3, pad=1).plan("sm_90a", mma="wgmma_ws", tile="128x128w8")
    fp16 = ConvCase("t", 2, 64, 9, 9, 64, 3, 3, pad=1)
    with pytest.raises(ValueError, match="ws_ctas=2"):
        fp16.plan("sm_90a", mma="wgmma_ws", tile="128x128w8", ws_ctas=2)
    with pytest.raises(ValueError, match="ws_ctas=2"):
        fp16.plan("sm_90a", mma="wgmma", tile="128x64w8", ws_ctas=2)
    for mma in ("wgmma", "mma.sync"):  # 192-row tiles exist on the warp-specialized kernel only
        with pytest.raises(ValueError, match="warp-specialized kernel only"):
            fp16.plan("sm_90a", mma=mma, tile="192x128w12")


def test_warp_specialized_default_by_reduction_and_static_output_size(monkeypatch):
    """sm_90a float16/bfloat16: the warp-specialized kernel for reductions >= 1024 (1x1: >= 512); tile by channels;
    with N*P*Q static, below half the SMs' worth of CTAs narrower tiles and then the largest reduction cluster whose
    CTAs fit at once with >= 4 reduction tiles each; float16/bfloat16 3x3 reductions of >= 32 tiles split before they
    narrow where the split grid fills half the SMs. The expected choices are the fastest measured (H100 run 2, the
    conv-1 sweeps of sessions 4 and 6). The 128-row rule alone: the 64-row tiles that replace its short 1x1 grids are
    test_short_1x1_grids_take_64_row_tiles_on_one_mma_warpgroup's."""
    from trt_fusedattn.plugins.conv import plan as conv_plan
    monkeypatch.setattr(conv_plan, "ROWS64_BY_DEFAULT", False)

    def choice(c, k, kernel, n=32, hw=14, dtype="float16", arch="sm_90a", stride=1):
        case = ConvCase("t", n, c, hw, hw, k, kernel, kernel, pad=kernel // 2, stride=stride, dtype=dtype)
        d = case.plan(arch).defines
        return bool(d.get("WARP_SPECIALIZED")), d["BLOCK_M"], d["BLOCK_N"], d.get("CLUSTER_K", 1)
    assert choice(64, 64, 3, hw=56) == (False, 128, 64, 1)        # 576-deep reduction: the unspecialized loop
    assert choice(256, 128, 1, hw=28)[0] is False and choice(512, 128, 1, hw=28)[0]  # 1x1 reductions >= 512
    # enough CTAs: the fewest waves times the tile's cost (conv-2 sweep, batch 32)
    # 25088 pixels: 128x128 makes 196 CTAs (two waves), 256x128 98 (one, 1.8), 192x128 131 (one, 1.4)
    assert choice(512, 128, 1, hw=28) == (True, 192, 128, 1)
    assert choice(128, 128, 3, hw=28) == (True, 192, 128, 1)
    assert choice(512, 256, 1, hw=28) == (True, 192, 128, 1)      # 262 CTAs: two waves of 192x128 (2.8) beat three of
                                                                  # 128x128 (392 CTAs, 3.0) and two of 256x128 (3.6)
    assert choice(512, 2048, 1, hw=7) == (True, 128, 256, 1)      # 104 CTAs of 128x256 (a tie with 256x128: kept)
    assert choice(256, 256, 3) == (True, 192, 128, 2)             # 6272 pixels: 98 CTAs of 128x128 (one part-filled
                                                                  # wave) -> 132 of 192x128 on 2-CTA clusters
    assert choice(256, 256, 3, n=64) == (True, 192, 128, 1)       # 196 CTAs of 128x128: the waves rule
    assert choice(2048, 512, 1, hw=7) == (True, 128, 128, 2)      # 32 tiles: 26 CTAs of 128x256 -> 52 of 128x128,
                                                                  # split before narrowing (104 CTAs)
    assert choice(128, 128, 3, n=8, hw=28) == (True, 128, 64, 1)  # 49 CTAs -> 98 narrow
    assert choice(256, 256, 3, n=8) == (True, 128, 128, 4)        # 1568 pixels: 26 CTAs -> 104 on 4-CTA clusters
    assert choice(1024, 256, 1, n=8) == (True, 128, 64, 2)
    assert choice(2048, 512, 1, n=8, hw=7) == (True, 128, 64, 3)  # 392 pixels: 32 narrow CTAs -> 96 on 3-CTA clusters
    assert choice(512, 512, 3, n=8, hw=7) == (True, 128, 64, 3)   # 72 tiles, but 16 -> 32 CTAs when split: narrow
    assert choice(512, 512, 3, n=1, hw=7) == (True, 128, 64, 4)   # 8 CTAs: 32 on 4-CTA clusters fit at once
    assert choice(1024, 256, 1, n=1) == (True, 128, 64, 4)        # 16 reduction tiles: 4 per CTA at most
    assert choice(512, 128, 1, n=1, hw=28) == (True, 128, 64, 4)  # 8 tiles, 14 CTAs: 2 per CTA on 56 (session 7)
    assert choice(512, 256, 1, n=1, hw=28) == (True, 128, 64, 3)  # 28 CTAs: 4-CTA clusters (112) over the cap
    assert choice(1024, 256, 1, n=8) == (True, 128, 64, 2)        # 1x1: narrow first (52 CTAs), then split
    assert choice(512, 1024, 1, n=8, hw=28, stride=2) == (True, 128, 128, 1)  # 128x256 -> 128x128: 104 CTAs
    assert choice(512, 512, 3, hw=7) == (True, 128, 128, 2)       # 72 tiles, 52 CTAs -> 104 split, kept wide
    assert choice(1024, 512, 1) == (True, 192, 128, 1)            # wide 1x1 output: 98 CTAs of 128x256 (1.8), 132
                                                                  # of 192x128 (1.4)
    assert choice(1024, 512, 1, n=8) == (True, 128, 64, 1)        # 26 wide CTAs -> 104 narrow
    assert choice(1024, 2048, 1, n=8, stride=2) == (True, 128, 64, 1)
    assert choice(256, 256, 3, dtype="bfloat16") == (True, 192, 128, 2)
    assert choice(256, 256, 3, arch="sm_89")[0] is False
    # symbolic batch: the channel rule alone
    sym = ConvCase("t", 8, 256, 14, 14, 256, 3, 3, pad=1)
    shapes = sym.shapes()
    shapes[0] = (Sym.var("n"), *shapes[0][1:])
    d = plan_conv(shapes, sym.dtypes(), sym.attrs(), "sm_90a").defines
    assert d["WARP_SPECIALIZED"] == 1 and (d["BLOCK_N"], d.get("CLUSTER_K", 1)) == (128, 1)
    assert "SHARE_W" not in d  # symbolic batch: no M-tile pairs either


def test_short_1x1_grids_take_64_row_tiles_on_one_mma_warpgroup():
    """1x1 layers whose 128-row tile makes fewer than half the SMs' worth of CTAs (before a reduction split) take 64x64
    on the warp-specialized kernel's one MMA warpgroup, split over the largest cluster that fits at once with >= 4
    tiles a rank where even those are short; deep reductions (>= 32 tiles) only split (prep-conv-next's small_grids
    sweep, H100). 3x3 layers, grids of enough 128-row CTAs, narrow outputs, FP8 and a symbolic batch keep their rule."""
    def choice(c, k, n, hw, kernel=1, stride=1, **kw):
        case = ConvCase("t", n, c, hw, hw, k, kernel, kernel, pad=kernel // 2, stride=stride, **kw)
        p = case.plan("sm_90a")
        d = p.defines
        return bool(d.get("WARP_SPECIALIZED")), d["BLOCK_M"], d["BLOCK_N"], d.get("CLUSTER_K", 1), p.block[0]
    assert choice(64, 256, 1, 56) == (True, 64, 64, 1, 256)       # 50 CTAs of 128x128 -> 196 of 64x64 (3.9 vs 4.9 µs)
    assert choice(256, 64, 1, 56) == (True, 64, 64, 1, 256)       # 4 tiles: no 2-CTA split (4.1 vs c2 4.4)
    assert choice(128, 512, 1, 28) == (True, 64, 64, 1, 256)      # 104 CTAs (4.0 vs 6.0)
    assert choice(512, 256, 1, 28) == (True, 64, 64, 2, 256)      # 52 CTAs, 8 tiles: 2-CTA split (4.9 vs 5.4)
    assert choice(1024, 256, 1, 14) == (True, 64, 64, 4, 256)     # 16 CTAs, 16 tiles: 4-CTA split (4.7 vs 5.7)
    assert choice(2048, 512, 1, 7) == (True, 64, 64, 4, 256)      # 32 tiles, split: 5.7 vs 7.3
    assert choice(1024, 256, 8, 14) == (True, 64, 64, 1, 256)     # 52 CTAs of 128x64 -> 100 (6.8 vs 7.0)
    ring = ConvCase("t", 8, 1024, 14, 14, 256, 1, 1).plan("sm_90a").defines["STAGES"]
    assert ring == 4                                              # 4 stages (6.6 vs 7.0 on 6; conv-2's deep_rings)
    x8 = next(c for c in X_E4M3_CASES if c.name == "x8_3x3_c256_b8_rows64").plan("sm_90a").defines  # the GPU case
    assert (x8["BLOCK_M"], x8["BLOCK_N"], x8.get("CLUSTER_K"), x8["BLOCK_K"]) == (64, 64, None, 128)  # 100 CTAs
    assert choice(256, 512, 1, 56, stride=2)[1:3] == (64, 64)     # strided 1x1: the same rule on the output grid
    assert choice(512, 128, 8, 28)[1] == 128                      # 98 CTAs of 128x64: kept (6.3 vs 6.4)
    assert choice(1024, 512, 8, 14)[1] == 128                     # 104 CTAs: kept (9.1 vs 9.3)
    assert choice(2048, 512, 32, 7)[1:4] == (128, 128, 2)         # deep, 200 CTAs of 64x64 unsplit: kept
    assert choice(128, 128, 1, 28, kernel=3)[1] == 128            # 3x3: not swept, kept
    assert choice(64, 32, 1, 56)[0] is False                      # K/G <= 32: mma.sync 128x32
    assert choice(256, 128, 1, 14, input_scale=FP8_INPUT_SCALE)[1] == 128  # FP8 (float16 X): kept
    # FP8 with e4m3 X, 3x3, where the WS rule splits a short grid: 64x64, unsplit where that makes >= 66 CTAs (b8 3x3
    # 256 @14, 100: 6.7-7.0 vs 7.0-7.2 on c2), else on 2-CTA clusters (3x3 512 @7: 8.3 vs 10.0 on 128x64 c2), with the
    # 6-stage ring; 1x1 and grids of < 66 such CTAs keep the 128-row rule
    def fp8(n, c, hw, kernel=3):
        case = ConvCase("t", n, c, hw, hw, c, kernel, kernel, pad=kernel // 2, input_scale=FP8_INPUT_SCALE)
        d = plan_conv(case.shapes(), ["float8_e4m3fn", *case.dtypes()[1:]], case.attrs(), "sm_90a").defines
        return d["BLOCK_M"], d["BLOCK_N"], d.get("CLUSTER_K", 1), d["STAGES"]
    assert fp8(8, 256, 14) == (64, 64, 1, 6) and fp8(8, 512, 7) == (64, 64, 2, 6)
    assert fp8(1, 256, 14)[0] == 128 and fp8(32, 256, 14)[0] == 128 and fp8(8, 1024, 14, kernel=1)[0] == 128
    sym = ConvCase("t", 1, 64, 56, 56, 256, 1, 1)
    shapes = sym.shapes()
    shapes[0] = (Sym.var("n"), *shapes[0][1:])
    assert plan_conv(shapes, sym.dtypes(), sym.attrs(), "sm_90a").defines["BLOCK_M"] == 128


def test_share_w_is_an_override_off_by_default(monkeypatch):
    """W sharing by M-tile pairs timed slower (conv-2): off in the default, on by share_w=True (grid.x rounded up to
    whole pairs); with the switch on, the default shares where N*P*Q is static and the reduction is not split."""
    from trt_fusedattn.plugins.conv import plan as conv_plan

    def plan(c, k, kernel, n=8, hw=28, **overrides):
        return ConvCase("t", n, c, hw, hw, k, kernel, kernel, pad=kernel // 2).plan("sm_90a", **overrides)
    assert "SHARE_W" not in plan(128, 128, 3).defines
    shared = plan(128, 128, 3, share_w=True)
    assert shared.defines.get("SHARE_W") == 1 and shared.grid[0] == 50  # 49 M tiles -> 25 pairs
    monkeypatch.setattr(conv_plan, "SHARE_W_BY_DEFAULT", True)
    assert plan(128, 128, 3).defines.get("SHARE_W") == 1
    assert "SHARE_W" not in plan(128, 128, 3, n=1).defines               # 4-CTA reduction split
    assert "SHARE_W" not in plan(128, 128, 3, cluster=2).defines
    assert "SHARE_W" not in plan(128, 128, 3, share_w=False).defines
    assert "SHARE_W" not in plan(64, 64, 3, hw=56).defines               # not the warp-specialized kernel


def test_fp8_e4m3_x_takes_the_warp_specialized_kernel_on_small_grids_and_192_row_tiles(monkeypatch):
    """FP8 with e4m3 X: the WS kernel where the output is too small for the channel tile and the tile is split over
    a cluster or the reduction is short (faster at batch 1 and 8 in conv-2/3), or where the waves rule picks 192-row
    tiles (b32 3x3 128 @28: faster in session 5's conv-1) or 128x128 (b32 3x3 256 @14: faster in session 10's conv-2),
    on 2-CTA clusters for deep reductions (b32 3x3 512 @7, conv-3); the unspecialized FP8 loop elsewhere. The 128-row rule
    alone
    (FP8_ROWS64_BY_DEFAULT off; its 64-row tiles: test_short_1x1_grids_take_64_row_tiles_on_one_mma_warpgroup)."""
    from trt_fusedattn.plugins.conv import plan as conv_plan
    monkeypatch.setattr(conv_plan, "FP8_ROWS64_BY_DEFAULT", False)
    def plan(n, hw, c=256):
        case = ConvCase("t", n, c, hw, hw, c, 3, 3, pad=1, scale=True, input_scale=FP8_INPUT_SCALE)
        return plan_conv(case.shapes(), ["float8_e4m3fn", *case.dtypes()[1:]], case.attrs(), "sm_90a")
    small, big = plan(8, 14), plan(32, 14)
    assert small.defines.get("WARP_SPECIALIZED") == 1 and small.defines.get("CLUSTER_K") == 2
    assert big.defines.get("WARP_SPECIALIZED") == 1 and "CLUSTER_K" not in big.defines and big.defines["BLOCK_K"] == 128
    assert (big.defines["BLOCK_M"], big.defines["BLOCK_N"]) == (128, 128)
    assert plan(8, 28, c=128).defines.get("WARP_SPECIALIZED") == 1          # narrowed to 128x64, 1152-deep
    deep = plan(32, 7, c=512).defines                   # 4608-deep: 128x128 on 2-CTA clusters (WS since session 10)
    assert deep.get("WARP_SPECIALIZED") == 1 and deep.get("CLUSTER_K") == 2 and deep["BLOCK_N"] == 128
    monkeypatch.setattr(conv_plan, "FP8_WS_DEEP_SPLIT", False)
    deep = plan(32, 7, c=512).defines                                       # the unspecialized 2-CTA split before
    assert "WARP_SPECIALIZED" not in deep and deep.get("CLUSTER_K") == 2 and deep["BLOCK_N"] == 128
    assert plan(8, 7, c=512).defines.get("CLUSTER_K") == 3                  # WS on 3-CTA clusters
    rows192 = plan(32, 28, c=128).defines                                   # 25088 pixels: 131 tiles of 192x128
    assert (rows192.get("WARP_SPECIALIZED"), rows192["BLOCK_M"], rows192["BLOCK_N"]) == (1, 192, 128)


def test_fp8_e4m3_x_short_3x3_grids_take_64_row_tiles_unsplit_at_block_k_128(monkeypatch):
    """FP8 with e4m3 X at batch 1 (fewer than 66 128x64 tiles), reductions of <= 9 tiles of 128: 64x64 on the WS
    kernel's one MMA warpgroup, unsplit, BLOCK_K 128 (session 10 conv-2: b1 3x3 64 @56 4.3 vs 5.9 µs, 128-channel
    layers 4.8-4.9 vs 5.3-5.4); the 256-channel layers (18 tiles) keep their 4-CTA split, batch 8 its tiles, and an
    override of the tile, BLOCK_K or cluster the override."""
    from trt_fusedattn.plugins.conv import plan as conv_plan

    def plan(n, hw, c, stride=1, **overrides):
        case = ConvCase("t", n, c, hw, hw, c, 3, 3, stride=stride, pad=1, scale=True, input_scale=FP8_INPUT_SCALE)
        d = plan_conv(case.shapes(), ["float8_e4m3fn", *case.dtypes()[1:]], case.attrs(), "sm_90a", **overrides).defines
        return d["BLOCK_M"], d["BLOCK_N"], d["BLOCK_K"], d.get("WARP_SPECIALIZED", 0), d.get("CLUSTER_K", 1)
    short = (64, 64, 128, 1, 1)
    assert plan(1, 56, 64) == plan(1, 56, 128, stride=2) == plan(1, 28, 128) == short
    assert plan(1, 14, 256) == (128, 64, 128, 1, 4)                          # 18 tiles: the 4-CTA split
    assert plan(8, 56, 64)[:4] == (128, 64, 64, 0) and plan(8, 28, 128) == (128, 64, 128, 1, 1)
    assert plan(1, 56, 64, block_k=64)[2] == 64 and plan(1, 28, 128, cluster=2)[4] == 2
    monkeypatch.setattr(conv_plan, "FP8_ROWS64_SHORT_MAX_TILES", 0)
    assert plan(1, 28, 128) == (128, 64, 128, 1, 4)


def test_fp8_e4m3_x_taps_inner_64_channel_grids_take_256_row_tiles(monkeypatch):
    """FP8 with e4m3 X, 64 channels, a grid of > 264 128x64 tiles (b32 3x3 64 @56: 784): 256x64 taps inner on the
    unspecialized wgmma loop, 4 stages (two CTAs an SM; session 11 conv-1: 17.7 vs 19.5 µs); batch 8 keeps 128x64
    without taps inner, FP8_ROWS256_TAPS_INNER off the 128x64 taps-inner plan."""
    from trt_fusedattn.plugins.conv import plan as conv_plan

    def plan(n):
        case = ConvCase("t", n, 64, 56, 56, 64, 3, 3, pad=1, scale=True, input_scale=FP8_INPUT_SCALE)
        p = plan_conv(case.shapes(), ["float8_e4m3fn", *case.dtypes()[1:]], case.attrs(), "sm_90a")
        return p.defines["BLOCK_M"], p.defines.get("TAPS_INNER", 0), p.defines["STAGES"], p.grid[0]
    assert plan(32) == (256, 1, 4, 392) and plan(8)[:2] == (128, 0)
    monkeypatch.setattr(conv_plan, "FP8_ROWS256_TAPS_INNER", False)
    assert plan(32)[:2] == (128, 1)


def test_depthwise_chunks_cover_the_channels_without_an_idle_quarter():
    """144 channels are 18 chunks of 8: blocks of 2 chunks (9 block columns, none part-empty) instead of 8 (a quarter
    of the last column's threads idle); counts that 8 chunks divide, or that no power of two >= 2 divides, keep 8."""
    from trt_fusedattn.plugins.conv.plan import depthwise_tile
    assert depthwise_tile(144, 144)["CHUNKS"] == 2 and depthwise_tile(96, 96)["CHUNKS"] == 4
    assert depthwise_tile(144, 144, 4)["DW_PIX"] == 4
    # two pixels a thread: stride 1 where the grid keeps >= 132 blocks (conv-2 sweep); stride 2 and small grids one
    dw = lambda n, c, hw, stride=1: ConvCase("dw", n, c, hw, hw, c, 3, 3, stride=stride, pad=1,  # noqa: E731
                                             groups=c).plan("sm_90a").defines["DW_PIX"]
    assert dw(32, 192, 28) == dw(8, 144, 56) == dw(8, 576, 14) == dw(32, 960, 7) == 2
    assert dw(32, 96, 112, stride=2) == dw(8, 960, 7) == dw(1, 144, 56) == 1
    with pytest.raises(ValueError, match="dw_pixels=3"):
        depthwise_tile(144, 144, 3)
    assert depthwise_tile(144, 144, chunk_override=18)["CHUNKS"] == 18  # 14 pixels a pass, 4 threads idle
    with pytest.raises(ValueError, match="dw_chunks=0"):
        depthwise_tile(144, 144, chunk_override=0)
    assert depthwise_tile(192, 192)["CHUNKS"] == 8 and depthwise_tile(40, 40)["CHUNKS"] == 8
    for c in (32, 96, 144, 192, 384, 576, 960):
        t = depthwise_tile(c, c)
        assert (c // t["DW_VEC"]) % t["CHUNKS"] == 0


def test_stride_2_depthwise_reading_under_64_bytes_a_pixel_takes_whole_pixel_blocks():
    """dw/2 144 @56 (2 chunks of 8 channels: 32 bytes of each pixel a block) takes all 18 chunks in one block, 2 pixels a
    thread, where that grid makes >= 4 waves of 132 blocks (b32: 18.7 vs 24.4 µs; b8, 224 blocks, lost: 7.0 vs 6.1;
    session 8 conv-3); 96 channels (4 chunks, 64 bytes), stride 1, smaller grids and overrides keep their block."""
    def dw(n, c, hw, stride=2, **overrides):
        p = ConvCase("dw", n, c, hw, hw, c, 3, 3, stride=stride, pad=1, groups=c).plan("sm_90a", **overrides)
        return p.defines["CHUNKS"], p.defines["DW_PIX"], p.grid
    assert dw(32, 144, 56) == (18, 2, (896, 1, 1))
    assert dw(8, 144, 56)[:2] == dw(1, 144, 56)[:2] == (2, 1)     # 224 / 28 whole-pixel blocks: kept
    assert dw(32, 96, 112)[:2] == (4, 1) and dw(32, 144, 56, stride=1)[:2] == (2, 2)
    assert dw(32, 144, 56, dw_chunks=2)[:2] == (2, 1) and dw(32, 144, 56, dw_pixels=1)[:2] == (2, 1)
    whole = next(c for c in CASES if c.name == "dw3x3_s2_c144_whole_pixels").plan("sm_90a")  # the GPU tests' case
    assert (whole.defines["CHUNKS"], whole.defines["DW_PIX"], whole.grid) == (18, 2, (554, 1, 1))


@pytest.mark.parametrize("c, stages", [(256, 3), (512, None), (128, 3)])
def test_a_256_deep_reduction_on_the_wgmma_loop_takes_three_stages_so_two_ctas_share_an_sm(c, stages):
    """1x1 convs over 256 channels on the 128x128 wgmma tile: 3 stages (96 KB, two CTAs an SM), not the 4 (128 KB,
    one) that held the whole reduction; 128 channels keep k tiles + 1 = 3, 512 take the warp-specialized kernel."""
    plan = ConvCase("1x1", 8, c, 28, 28, 512, 1, 1).plan("sm_90a")
    d = plan.defines
    if stages is None:
        assert d.get("WARP_SPECIALIZED") == 1
        return
    assert (d["BLOCK_M"], d["BLOCK_N"], d.get("WGMMA"), d["STAGES"]) == (128, 128, 1, stages)
    assert 2 * plan.shared_mem <= SHARED_LIMIT["sm_90a"] or c != 256


def test_the_three_stage_ring_only_where_the_grid_outnumbers_the_sms(monkeypatch):
    """The 3-stage ring pays only when a second CTA comes to the SM: with N*P*Q static and at most SM_COUNT tiles
    (batch 1; 1x1 256>1024 @14 at batch 8: 104 CTAs) the 256-deep reduction keeps 4 stages (lead's H100 run: 3 stages
    ~5% slower there); a symbolic batch keeps the 3 (the batch-32 rule). Batch 1's grids of 25 tiles take 64-row tiles
    on the warp-specialized kernel by default now: the rule is checked without them."""
    from trt_fusedattn.plugins.conv import plan as conv_plan
    monkeypatch.setattr(conv_plan, "ROWS64_BY_DEFAULT", False)
    def stages(n, hw, k):
        return ConvCase("1x1", n, 256, hw, hw, k, 1, 1).plan("sm_90a").defines["STAGES"]
    assert stages(8, 56, 128) == 3 and stages(32, 14, 1024) == 3   # 196 / 392 CTAs
    assert stages(1, 56, 128) == 4 and stages(8, 14, 1024) == 4    # 25 / 104 CTAs
    sym = ConvCase("1x1", 8, 256, 14, 14, 1024, 1, 1)
    shapes = sym.shapes()
    shapes[0] = (Sym.var("n"), *shapes[0][1:])
    assert plan_conv(shapes, sym.dtypes(), sym.attrs(), "sm_90a").defines["STAGES"] == 3


def test_narrow_outputs_on_large_grids_take_one_warpgroup_on_three_stages():
    """K/G <= 64 on a static grid of more than two 128x64 tiles per SM: the one-warpgroup 128x64 tile on a 3-stage ring
    (three CTAs an SM by shared memory); smaller grids and a symbolic batch keep two warpgroups on the plan's ring."""
    from trt_fusedattn.plugins.conv.plan import SM_COUNT

    def plan(n, c=256, kernel=1):
        return ConvCase("t", n, c, 56, 56, 64, kernel, kernel, pad=kernel // 2).plan("sm_90a")
    for c, kernel in ((256, 1), (64, 3), (64, 1)):
        big, small = plan(32, c, kernel), plan(8, c, kernel)
        assert big.grid[0] > 2 * SM_COUNT >= small.grid[0]  # 784 / 196 CTAs
        d = big.defines
        assert (d["BLOCK_M"], d["BLOCK_N"], d["WARPS_M"] * d["WARPS_N"], d["STAGES"], d.get("WGMMA")) == (128, 64, 4, 3, 1)
        assert big.block == (128, 1, 1) and 3 * big.shared_mem <= SHARED_LIMIT["sm_90a"]
        assert small.defines["WARPS_M"] * small.defines["WARPS_N"] == 8
    sym = ConvCase("t", 32, 256, 56, 56, 64, 1, 1)
    shapes = sym.shapes()
    shapes[0] = (Sym.var("n"), *shapes[0][1:])
    d = plan_conv(shapes, sym.dtypes(), sym.attrs(), "sm_90a").defines
    assert d["WARPS_M"] * d["WARPS_N"] == 8


def test_the_tap_row_gather_where_a_filter_row_fills_over_half_a_tile():
    """The element gather takes the tap-row loader (TAP_ROWS, TAP_CG = C/G) where KW * C/G is in (16, 32]: the 7x7
    stem over 3 channels (21), 3x3 over 6 (18), 5x5 over 5 (25); not MobileNetV2's 3x3 stem over 3 (9: the padding
    would more than double its tensor-core work), nor 16-byte loads, groups, dilated rows or FP8. tap_rows=True forces
    it where it fits and is refused in one line where it does not."""
    def defines(c, k, kernel, **kw):
        return ConvCase("t", 2, c, 23, 21, k, kernel, kernel, pad=kernel // 2, **kw).plan("sm_90a").defines
    for c, kernel in ((3, 7), (6, 3), (5, 5)):
        d = defines(c, 64, kernel)
        assert (d["TAP_ROWS"], d["TAP_CG"], d["IN_VEC"], d["BLOCK_K"]) == (1, c, 1, 32)
    for c, kernel, kw in ((3, 3, {}), (16, 3, {}), (6, 3, dict(groups=2)), (6, 3, dict(dil=2)),
                          (6, 3, dict(scale=True, input_scale=FP8_INPUT_SCALE))):
        assert "TAP_ROWS" not in defines(c, 64, kernel, **kw)
    forced = ConvCase("t", 2, 3, 23, 21, 32, 3, 3, pad=1).plan("sm_90a", tap_rows=True).defines
    assert forced["TAP_ROWS"] == 1 and "TAP_ROWS" not in ConvCase("t", 2, 3, 23, 21, 64, 7, 7, pad=3).plan(
        "sm_90a", tap_rows=False).defines
    with pytest.raises(ValueError, match="tap_rows needs the element gather"):
        ConvCase("t", 2, 16, 9, 9, 64, 3, 3, pad=1).plan("sm_90a", tap_rows=True)


def test_the_tap_row_stem_takes_four_blocks_per_sm_where_they_save_waves():
    """The tap-row kernel's register cap: 4 blocks per SM (3 stages) where that saves enough waves on sm_90a (the
    ResNet-50 stem at batch 32: 3136 CTAs, 6 waves of 4 at 1.2 against 8 of 3), else 3 (4 stages): batch 8 (784 CTAs,
    two waves either way), batch 1, a symbolic batch, and older arches."""
    def defines(n, arch="sm_90a", **kw):
        return ConvCase("stem", n, 3, 224, 224, 64, 7, 7, stride=2, pad=3).plan(arch, **kw).defines
    assert (defines(32)["TAP_ROWS_BLOCKS"], defines(32)["STAGES"]) == (4, 3)
    assert all((defines(n)["TAP_ROWS_BLOCKS"], defines(n)["STAGES"]) == (3, 4) for n in (1, 8))
    assert defines(32, "sm_80")["TAP_ROWS_BLOCKS"] == 3 and defines(32, stages=4)["STAGES"] == 4
    sym = ConvCase("stem", 32, 3, 224, 224, 64, 7, 7, stride=2, pad=3)
    shapes = sym.shapes()
    shapes[0] = (Sym.var("n"), *shapes[0][1:])
    assert plan_conv(shapes, sym.dtypes(), sym.attrs(), "sm_90a").defines["TAP_ROWS_BLOCKS"] == 3
