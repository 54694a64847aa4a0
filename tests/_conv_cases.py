"""FusedConv test cases shared by the plan, compile and GPU tests: one list, so CI compiles what the GPU runs."""
from __future__ import annotations

from dataclasses import dataclass, replace

from trt_fusedattn.plugins.conv.contract import ACTIVATIONS, FUSED_CONV
from trt_fusedattn.plugins.conv.plan import plan_conv

# Parameters per activation for the sweep (clip as ReLU6, leaky_relu and hard_sigmoid as ONNX's defaults).
ACTIVATION_PARAMS = {"clip": (0.0, 6.0), "leaky_relu": (0.1, 0.0), "hard_sigmoid": (0.2, 0.5)}


@dataclass(frozen=True)
class ConvCase:
    """One FusedConv call: shapes (NCHW / [K, kH, kW, C/G]), conv attributes, epilogue, dtype."""

    name: str
    n: int
    c: int
    h: int
    w: int
    k: int
    kh: int
    kw: int
    stride: int = 1
    pad: int = 0
    dil: int = 1
    groups: int = 1
    dtype: str = "float16"
    activation: str = "relu"
    residual: bool = False
    post_activation: str = "none"
    shift: bool = True
    scale: bool = False
    input_scale: float = 0.0   # FP8 (e4m3 W, X quantized in the kernel) when != 0
    x_e4m3: bool = False       # FP8 with X already e4m3 in memory (dtype is then Y's: float16)

    @property
    def fp8(self) -> bool:
        return self.input_scale != 0.0

    def attrs(self) -> dict:
        a, b = ACTIVATION_PARAMS.get(self.activation, (0.0, 0.0))
        pa, pb = ACTIVATION_PARAMS.get(self.post_activation, (0.0, 0.0))
        return FUSED_CONV.resolve(dict(
            strides=(self.stride,) * 2, pads=(self.pad,) * 4, dilations=(self.dil,) * 2, group=self.groups,
            activation=self.activation, activation_alpha=a, activation_beta=b,
            post_activation=self.post_activation, post_activation_alpha=pa, post_activation_beta=pb,
            input_scale=self.input_scale))

    @property
    def out_hw(self) -> tuple:
        return tuple((s + 2 * self.pad - self.dil * (k - 1) - 1) // self.stride + 1
                     for s, k in ((self.h, self.kh), (self.w, self.kw)))

    def shapes(self) -> list:
        p, q = self.out_hw
        return [(self.n, self.c, self.h, self.w), (self.k, self.kh, self.kw, self.c // self.groups),
                (self.k,) if self.shift else None, (self.k,) if self.scale else None,
                (self.n, self.k, p, q) if self.residual else None]

    def dtypes(self) -> list:
        return ["float8_e4m3fn" if self.x_e4m3 else self.dtype, "float8_e4m3fn" if self.fp8 else self.dtype, "float32" if self.shift else None,
                "float32" if self.scale else None, self.dtype if self.residual else None]

    def plan(self, arch: str, **overrides):
        return plan_conv(self.shapes(), self.dtypes(), self.attrs(), arch, **overrides)


_BASE = [
    ConvCase("1x1_c64_k256", 2, 64, 14, 14, 256, 1, 1),
    ConvCase("1x1_s2_c256_k128_odd", 1, 256, 15, 15, 128, 1, 1, stride=2, residual=True, post_activation="relu"),
    ConvCase("3x3_c64_k64_17x13", 2, 64, 17, 13, 64, 3, 3, pad=1, scale=True),
    ConvCase("3x3_c48_k40", 3, 48, 11, 9, 40, 3, 3, pad=1, residual=True, post_activation="relu"),
    ConvCase("5x5_c24_k20", 2, 24, 13, 13, 20, 5, 5, pad=2, activation="silu"),
    ConvCase("7x7_s2_c3_k64_stem", 2, 3, 31, 29, 64, 7, 7, stride=2, pad=3),
    # the tap-row gather (default where a filter row fills over half a 32-element tile): an even row (18 elements),
    # a 25-element row at stride 2, both with edge and interior windows, odd and even first elements
    ConvCase("3x3_c6_k40_tap_rows", 2, 6, 13, 11, 40, 3, 3, pad=1, residual=True, post_activation="relu"),
    ConvCase("5x5_s2_c5_k24_tap_rows", 3, 5, 21, 19, 24, 5, 5, stride=2, pad=2, activation="silu"),
    ConvCase("3x3_c5_k7_odd", 2, 5, 9, 11, 7, 3, 3, pad=1, residual=True, post_activation="relu"),
    ConvCase("3x3_c200_k72_bias_free", 1, 200, 7, 7, 72, 3, 3, pad=1, shift=False, activation="none"),
    ConvCase("3x3_dil2_c16_k16", 2, 16, 12, 12, 16, 3, 3, pad=2, dil=2),
    ConvCase("3x3_s2_c32_k96_batch32", 32, 32, 9, 9, 96, 3, 3, stride=2, pad=1, residual=True,
             post_activation="relu"),
    ConvCase("1x1_c128_k520_batch32", 32, 128, 5, 5, 520, 1, 1),
    ConvCase("3x3_c256_k128_split", 3, 256, 7, 7, 128, 3, 3, pad=1, residual=True, post_activation="relu"),
    ConvCase("1x1_c2048_k64_split", 2, 2048, 7, 5, 64, 1, 1, scale=True),
    ConvCase("7x7_c45_k24_split_gather", 2, 45, 9, 9, 24, 7, 7, pad=3, residual=True),
    # 49 taps on the 16-byte loader: each A row tests the window per tile (RowTaps<false>; <= 32 taps use a bit each)
    ConvCase("7x7_c16_k24_many_taps", 2, 16, 11, 10, 24, 7, 7, pad=3),
    ConvCase("1x1_c64_k1024_wide", 2, 64, 6, 7, 1024, 1, 1, residual=True, post_activation="relu"),
    ConvCase("3x3_groups4_c64_k64", 2, 64, 10, 10, 64, 3, 3, pad=1, groups=4),
    ConvCase("3x3_groups8_cg4_kg6", 2, 32, 9, 9, 48, 3, 3, pad=1, groups=8, residual=True),
    ConvCase("dw3x3_c96", 2, 96, 15, 15, 96, 3, 3, pad=1, groups=96, activation="clip"),
    ConvCase("dw3x3_s2_c144_batch32", 32, 144, 11, 11, 144, 3, 3, stride=2, pad=1, groups=144, activation="clip"),
    # 15488 output pixels: 554 whole-pixel blocks (18 chunks, 2 pixels a thread: the plan's default for dw/2 144)
    ConvCase("dw3x3_s2_c144_whole_pixels", 8, 144, 87, 87, 144, 3, 3, stride=2, pad=1, groups=144, activation="clip"),
    ConvCase("dw5x5_c40_residual", 2, 40, 9, 9, 40, 5, 5, pad=2, groups=40, residual=True, activation="none"),
    ConvCase("dw3x3_c13_odd", 1, 13, 7, 9, 13, 3, 3, pad=1, groups=13),
    ConvCase("dw3x3_mult2_c8_k16", 2, 8, 8, 8, 16, 3, 3, pad=1, groups=8, scale=True),
]

# Every activation, as the main activation and (rotated by one) as the post-activation after a residual add;
# the base cases run activations without a residual.
_NAMES = list(ACTIVATIONS)
_ACTIVATION_SWEEP = [
    ConvCase(f"act_{a}_post_{b}", 2, 32, 6, 6, 24, 3, 3, pad=1, activation=a, residual=True, post_activation=b)
    for a, b in zip(_NAMES, _NAMES[1:] + _NAMES[:1])] + [
    ConvCase(f"dw_act_{a}", 2, 16, 6, 6, 16, 3, 3, pad=1, groups=16, activation=a, residual=True,
             post_activation=a) for a in ("gelu", "hard_swish", "leaky_relu")]

CASES = _BASE + [replace(c, name=c.name + "_bf16", dtype="bfloat16") for c in _BASE] + _ACTIVATION_SWEEP
# Depthwise blocks of channel chunk counts that need not divide 256 (dw_chunks) at 1 and 2 pixels a thread (dw_pixels):
# (case, plan overrides), run by the GPU test and compiled by the compile test.
DEPTHWISE_CHUNK_PLANS = [(c, dict(dw_chunks=chunks, dw_pixels=pixels)) for c in CASES
                         if c.name in ("dw3x3_s2_c144_batch32", "dw3x3_c96_bf16", "dw5x5_c40_residual", "dw3x3_c13_odd")
                         for chunks, pixels in ((18, 1), (18, 2), (12, 2), (24, 1))]

# FP8 (E4M3, sm_89+): X ~ N(0, 1) quantized with a per-tensor scale that saturates its tail (|x| > 448 * 0.0123
# = 5.5 is rare but reachable), W e4m3 with per-output-channel scales; 16-byte loads, the element gather (odd C, and
# reductions that are not multiples of 16), split groups, strides, groups, residual and activations.
FP8_INPUT_SCALE = 0.0123
_FP8 = [
    ConvCase("fp8_1x1_c64_k256", 2, 64, 14, 14, 256, 1, 1),
    ConvCase("fp8_3x3_c64_k64_17x13", 2, 64, 17, 13, 64, 3, 3, pad=1),
    ConvCase("fp8_3x3_s2_c32_k96_batch32", 32, 32, 9, 9, 96, 3, 3, stride=2, pad=1, residual=True,
             post_activation="relu"),
    ConvCase("fp8_3x3_c256_k128_split", 3, 256, 7, 7, 128, 3, 3, pad=1, residual=True, post_activation="relu"),
    ConvCase("fp8_1x1_s2_c256_k128_odd", 1, 256, 15, 15, 128, 1, 1, stride=2, residual=True,
             post_activation="relu"),
    ConvCase("fp8_3x3_c5_k7_odd", 2, 5, 9, 11, 7, 3, 3, pad=1, residual=True, post_activation="relu"),
    ConvCase("fp8_3x3_c24_k40_gather", 3, 24, 7, 7, 40, 3, 3, pad=1, activation="silu"),
    ConvCase("fp8_3x3_groups4_c64_k64", 2, 64, 10, 10, 64, 3, 3, pad=1, groups=4, shift=False),
    ConvCase("fp8_3x3_c128_k72_gelu", 2, 128, 9, 9, 72, 3, 3, pad=1, activation="gelu", residual=True,
             post_activation="hard_swish"),
]
_FP8 = [replace(c, scale=True, input_scale=FP8_INPUT_SCALE) for c in _FP8]
FP8_CASES = _FP8 + [replace(c, name=c.name + "_bf16", dtype="bfloat16") for c in _FP8[1:5]]


@dataclass(frozen=True, eq=False)
class TunedCase:
    """A ConvCase planned with implicit-GEMM overrides (``plan_conv``'s tile/mma/cluster/taps_inner), for the
    main loops and reduction splits the default plan does not pick."""

    name: str
    case: ConvCase
    overrides: dict

    def plan(self, arch: str):
        return self.case.plan(arch, **self.overrides)


def _tuned(case: ConvCase, tile: str, **overrides) -> TunedCase:
    overrides = dict(tile=tile, mma="wgmma", **overrides)
    suffix = "_".join([tile] + [f"{k}{'' if v is True else v}" for k, v in overrides.items()
                                if k not in ("tile", "mma")])
    return TunedCase(f"{case.name}__{suffix}", case, overrides)


# Hopper (sm_90a) wgmma main loop for float16/bfloat16 and FP8 on every warpgroup tile, reductions split over a
# thread-block cluster (uneven slices: 9 tiles of a 3x3 over C/G = 64 on 2 or 4 CTAs; a split group left with no
# tile), taps-inner order; odd M (not a multiple of BLOCK_M, batch 1 and several M tiles), K/G not a multiple of
# BLOCK_N, BLOCK_K 32 (64-byte swizzle) and 64, conv groups, residual / post-activation and scale epilogues.
_WGMMA_BF16 = dict(dtype="bfloat16")
WGMMA_CASES = [
    # float16 / bfloat16 on each warpgroup tile
    _tuned(ConvCase("wg_3x3_c64_k96_b1", 1, 64, 11, 9, 96, 3, 3, pad=1, scale=True), "128x128w8"),
    _tuned(ConvCase("wg_1x1_c128_k320_bf16", 2, 128, 13, 11, 320, 1, 1, residual=True, post_activation="relu",
                    **_WGMMA_BF16), "128x256w8"),
    _tuned(ConvCase("wg_3x3_s2_c32_k64", 3, 32, 17, 15, 64, 3, 3, stride=2, pad=1), "64x128w4"),   # BLOCK_K 32
    _tuned(ConvCase("wg_3x3_c96_k72_bf16", 2, 96, 10, 10, 72, 3, 3, pad=1, activation="silu", **_WGMMA_BF16),
           "128x64w4"),                                                                             # BLOCK_K 32
    _tuned(ConvCase("wg_1x1_c64_k200", 2, 64, 9, 7, 200, 1, 1, residual=True), "64x256w4"),
    _tuned(ConvCase("wg_3x3_c64_k128_b1_bf16", 1, 64, 19, 17, 128, 3, 3, pad=1, residual=True,
                    post_activation="relu", **_WGMMA_BF16), "128x64w8"),
    _tuned(ConvCase("wg_3x3_c128_k128_split", 2, 128, 7, 7, 128, 3, 3, pad=1, scale=True), "128x128w8s2"),
    _tuned(ConvCase("wg_3x3_groups2_c128_k192", 2, 128, 8, 8, 192, 3, 3, pad=1, groups=2), "64x128w4"),
    _tuned(ConvCase("wg_1x1_c64_k24_narrow", 2, 64, 9, 9, 24, 1, 1, activation="none"), "128x32w4"),
    # cluster splits of the reduction
    _tuned(ConvCase("wg_3x3_c64_k64", 2, 64, 9, 9, 64, 3, 3, pad=1, residual=True, post_activation="relu"),
           "128x128w8", cluster=2),
    _tuned(ConvCase("wg_3x3_c64_k80_b1_bf16", 1, 64, 13, 11, 80, 3, 3, pad=1, **_WGMMA_BF16), "64x128w4",
           cluster=4),
    _tuned(ConvCase("wg_3x3_c128_k64_split", 2, 128, 7, 9, 64, 3, 3, pad=1, scale=True), "128x128w8s2",
           cluster=2),
    _tuned(ConvCase("wg_1x1_c256_k96_split", 3, 256, 7, 7, 96, 1, 1, residual=True), "64x128w4s2",
           cluster=4),                                            # 4 tiles over 4 CTAs: split group 1 gets none
    _tuned(ConvCase("wg_3x3_groups2_c128_k128_bf16", 2, 128, 9, 7, 128, 3, 3, pad=1, groups=2, residual=True,
                    post_activation="relu", **_WGMMA_BF16), "128x64w4", cluster=4),
    # taps-inner reduction order (A through L1)
    _tuned(ConvCase("wg_3x3_c128_k64_ti", 2, 128, 10, 9, 64, 3, 3, pad=1), "128x64w4", taps_inner=True),
    _tuned(ConvCase("wg_3x3_s2_c64_k128_ti_bf16", 3, 64, 11, 11, 128, 3, 3, stride=2, pad=1, scale=True,
                    **_WGMMA_BF16), "128x128w8", taps_inner=True, cluster=2),
    _tuned(ConvCase("wg_3x3_dil2_c64_k256_ti", 1, 64, 12, 10, 256, 3, 3, pad=2, dil=2, residual=True),
           "64x256w4", taps_inner=True, cluster=4),
    # FP8 (e4m3 W, X quantized in the kernel)
    _tuned(ConvCase("wg_fp8_3x3_c64_k96", 2, 64, 9, 9, 96, 3, 3, pad=1, scale=True, input_scale=FP8_INPUT_SCALE),
           "128x128w8"),
    _tuned(ConvCase("wg_fp8_3x3_c64_k64_bf16", 1, 64, 13, 11, 64, 3, 3, pad=1, scale=True, residual=True,
                    post_activation="relu", input_scale=FP8_INPUT_SCALE, **_WGMMA_BF16), "64x128w4", cluster=2),
    _tuned(ConvCase("wg_fp8_3x3_c128_k72", 2, 128, 9, 9, 72, 3, 3, pad=1, scale=True, activation="gelu",
                    input_scale=FP8_INPUT_SCALE), "128x64w8", taps_inner=True),
    # e4m3 X, BLOCK_K 128, a 2-CTA split with the sums past the ring (the FP8 b32 512-channel default), K/G 192
    _tuned(ConvCase("wg_x8_3x3_c512_k192", 2, 512, 7, 7, 192, 3, 3, pad=1, scale=True, residual=True,
                    post_activation="relu", input_scale=FP8_INPUT_SCALE, x_e4m3=True), "128x128w8", cluster=2),
    # e4m3 X, taps inner over 64 channels (the b32 3x3 64 @56 candidates): 256-row tiles (two 64-row blocks a
    # warpgroup; 663 rows: a part-filled last tile), 64-row tiles on one warpgroup (K/G 72 past a 64-column tile), the
    # 128x64 default on a 6-stage ring
    _tuned(ConvCase("wg_x8_3x3_c64_k64_m256", 3, 64, 17, 13, 64, 3, 3, pad=1, scale=True, residual=True,
                    post_activation="relu", input_scale=FP8_INPUT_SCALE, x_e4m3=True), "256x64w8", taps_inner=True),
    _tuned(ConvCase("wg_x8_3x3_c64_k72_m64", 2, 64, 13, 11, 72, 3, 3, pad=1, scale=True, input_scale=FP8_INPUT_SCALE,
                    x_e4m3=True), "64x64w4", taps_inner=True),
    _tuned(ConvCase("wg_x8_3x3_s2_c64_k64_6st", 3, 64, 23, 21, 64, 3, 3, stride=2, pad=1, scale=True,
                    input_scale=FP8_INPUT_SCALE, x_e4m3=True), "128x64w8", taps_inner=True, stages=6),
]

# FP8 with e4m3 X in memory (what an FP8 producer writes): A moves as bytes, no quantize pass; C/G % 16 == 0. The
# plan's default on each arch (wgmma on sm_90a: BLOCK_K 128 over >= 256 channels, the 2-CTA cluster for K/G 512),
# odd sizes, split groups, residual / post-activation.
X_E4M3_CASES = [
    ConvCase("x8_3x3_c64_k64_17x13", 2, 64, 17, 13, 64, 3, 3, pad=1, input_scale=FP8_INPUT_SCALE, x_e4m3=True),
    ConvCase("x8_3x3_c256_k256_bk128", 2, 256, 7, 9, 256, 3, 3, pad=1, input_scale=FP8_INPUT_SCALE, x_e4m3=True,
             residual=True, post_activation="relu"),
    ConvCase("x8_3x3_s2_c512_k512_cluster", 3, 512, 7, 7, 512, 3, 3, stride=2, pad=1, input_scale=FP8_INPUT_SCALE,
             x_e4m3=True, activation="silu"),
    ConvCase("x8_1x1_c48_k40_odd", 1, 48, 9, 11, 40, 1, 1, input_scale=FP8_INPUT_SCALE, x_e4m3=True),
    ConvCase("x8_3x3_groups2_c64_k96", 2, 64, 8, 8, 96, 3, 3, pad=1, groups=2, input_scale=FP8_INPUT_SCALE,
             x_e4m3=True, residual=True),
    # batch 1, 128 channels strided (49 rows), K/G 96 past a 64-column tile: the plan's 64x64 unsplit at BLOCK_K 128
    # (FP8_ROWS64_SHORT_MAX_TILES; x8_3x3_c64_k64_17x13 takes it too: 128-byte tiles over two taps of 64 channels)
    ConvCase("x8_3x3_s2_c128_k96_b1_short", 1, 128, 13, 14, 96, 3, 3, stride=2, pad=1, scale=True,
             input_scale=FP8_INPUT_SCALE, x_e4m3=True, residual=True, post_activation="relu"),
    # 1568 output rows: the plan's 64x64 tiles, unsplit (100 CTAs; FP8_ROWS64_BY_DEFAULT, FP8_ROWS64_UNSPLIT_MIN_CTAS)
    ConvCase("x8_3x3_c256_b8_rows64", 8, 256, 14, 14, 256, 3, 3, pad=1, input_scale=FP8_INPUT_SCALE, x_e4m3=True,
             residual=True, post_activation="relu"),
]

# The warp-specialized Hopper kernel (implicit_gemm_sm90.cu, mma="wgmma_ws"), float16/bfloat16 and FP8 with e4m3 X,
# forced onto each of its
# 8-warp tiles, 192x128 and the 64-row tiles: odd M (batch 1, several M tiles, rows past M), K/G not a multiple of
# BLOCK_N, BLOCK_K 32 (64-byte swizzle) and 64, a ring deeper than the reduction (one tile) and the shallowest ring
# (3 stages), two blocks per SM, strides, dilation, conv groups, taps-inner order, cluster splits (uneven slices; a
# CTA of the cluster with no tile), residual / post-activation / scale epilogues.
def _ws(case: ConvCase, tile: str, **overrides) -> TunedCase:
    tuned = _tuned(case, tile, **overrides)
    return TunedCase(tuned.name.replace(case.name, case.name + "_ws", 1), case, {**tuned.overrides, "mma": "wgmma_ws"})


WS_CASES = [
    _ws(ConvCase("3x3_c64_k96_b1", 1, 64, 11, 9, 96, 3, 3, pad=1, scale=True), "128x128w8"),
    _ws(ConvCase("3x3_c256_k256", 2, 256, 7, 9, 256, 3, 3, pad=1, residual=True, post_activation="relu"),
        "128x256w8"),
    _ws(ConvCase("1x1_c128_k320_bf16", 2, 128, 13, 11, 320, 1, 1, residual=True, **_WGMMA_BF16), "256x128w8"),
    _ws(ConvCase("3x3_c96_k72_bf16", 2, 96, 10, 10, 72, 3, 3, pad=1, activation="silu", **_WGMMA_BF16),
        "128x64w8"),                                                                              # BLOCK_K 32
    _ws(ConvCase("3x3_s2_c64_k128", 5, 64, 17, 15, 128, 3, 3, stride=2, pad=1, scale=True), "128x128w8"),
    _ws(ConvCase("3x3_dil2_c64_k128_bf16", 2, 64, 12, 10, 128, 3, 3, pad=2, dil=2, **_WGMMA_BF16), "256x128w8"),
    _ws(ConvCase("3x3_groups2_c128_k192", 2, 128, 8, 8, 192, 3, 3, pad=1, groups=2, residual=True), "128x64w8"),
    _ws(ConvCase("1x1_c64_k64_one_tile", 2, 64, 9, 9, 64, 1, 1, activation="none"), "128x64w8"),
    _ws(ConvCase("3x3_c64_k64_3stages", 2, 64, 9, 9, 64, 3, 3, pad=1), "128x128w8", stages=3),
    _ws(ConvCase("3x3_c128_k64_ti", 2, 128, 10, 9, 64, 3, 3, pad=1), "128x64w8", taps_inner=True),
    _ws(ConvCase("3x3_c128_k96_2ctas_bf16", 3, 128, 11, 11, 96, 3, 3, pad=1, residual=True, post_activation="relu",
                 **_WGMMA_BF16), "128x64w8", ws_ctas=2),                                   # two blocks per SM
    # cluster splits of the reduction
    _ws(ConvCase("3x3_c256_k128_b1", 1, 256, 7, 7, 128, 3, 3, pad=1, residual=True, post_activation="relu"),
        "128x128w8", cluster=2),
    _ws(ConvCase("3x3_c64_k80_b1_bf16", 1, 64, 13, 11, 80, 3, 3, pad=1, **_WGMMA_BF16), "128x128w8", cluster=4),
    _ws(ConvCase("1x1_c64_k64_empty_rank", 2, 64, 7, 7, 64, 1, 1, residual=True), "128x64w8", cluster=2),
    _ws(ConvCase("3x3_s2_c128_k256_bf16", 3, 128, 11, 11, 256, 3, 3, stride=2, pad=1, scale=True, **_WGMMA_BF16),
        "128x256w8", cluster=2),
    # W tiles shared by M-tile pairs (share_w: each CTA of a 2-CTA cluster loads half of W and pushes it to the other):
    # K/G not a multiple of BLOCK_N (zero-filled rows pushed; with 128x256 all of rank 1's half), an odd M-tile count
    # (the last pair's rank 1 has no output row), a one-tile reduction (every push after the loop), the 3-stage ring
    # (push lag 1), BLOCK_K 32, bf16, residual / scale epilogues
    _ws(ConvCase("3x3_c128_k192_share", 3, 128, 9, 9, 192, 3, 3, pad=1, residual=True, post_activation="relu"),
        "128x128w8", share_w=True),
    _ws(ConvCase("3x3_c64_k96_share_bf16", 2, 64, 15, 11, 96, 3, 3, pad=1, **_WGMMA_BF16), "128x64w8", share_w=True),
    _ws(ConvCase("1x1_c64_k128_share_one_tile", 2, 64, 9, 9, 128, 1, 1, residual=True), "128x256w8", share_w=True),
    _ws(ConvCase("3x3_c96_k128_share_3stages", 2, 96, 8, 8, 128, 3, 3, pad=1, scale=True), "256x128w8", share_w=True,
        stages=3),
    # 3-CTA reduction clusters (uneven slices: 23 tiles of 32 as 7, 8, 8), two blocks per SM on them (4 tiles as 1, 1,
    # 2: the pushed sums past a 3-stage ring; 8 as 2, 3, 3: in a 4-stage ring's bytes)
    _ws(ConvCase("3x3_c80_k64_b1", 1, 80, 9, 9, 64, 3, 3, pad=1, residual=True), "128x64w8", cluster=3),
    _ws(ConvCase("1x1_c256_k96_2ctas_c3", 1, 256, 9, 9, 96, 1, 1, residual=True, post_activation="relu"), "128x64w8",
        ws_ctas=2, cluster=3),
    _ws(ConvCase("1x1_c512_k64_2ctas_c3_bf16", 2, 512, 7, 7, 64, 1, 1, scale=True, **_WGMMA_BF16), "128x64w8",
        ws_ctas=2, cluster=3),
    # FP8 with e4m3 X (A and W as bytes, wgmma k32 e4m3): BLOCK_K 128 over 256 channels, 64 with W shared, a 3-CTA
    # reduction cluster
    _ws(ConvCase("x8_3x3_c256_k192", 2, 256, 7, 9, 192, 3, 3, pad=1, scale=True, input_scale=FP8_INPUT_SCALE,
                 x_e4m3=True, residual=True, post_activation="relu"), "128x128w8"),
    _ws(ConvCase("x8_3x3_c64_k96_share", 3, 64, 9, 9, 96, 3, 3, pad=1, scale=True, input_scale=FP8_INPUT_SCALE,
                 x_e4m3=True), "128x64w8", share_w=True),
    _ws(ConvCase("x8_3x3_c128_k128_b1", 1, 128, 7, 7, 128, 3, 3, pad=1, scale=True, input_scale=FP8_INPUT_SCALE,
                 x_e4m3=True, activation="silu"), "128x64w8", cluster=3),
    # 128x128 on a 2-CTA split, sums past a 6-stage ring (the b32 512-channel default), K/G 192
    _ws(ConvCase("x8_3x3_c512_k192", 2, 512, 7, 7, 192, 3, 3, pad=1, scale=True, residual=True,
                 post_activation="relu", input_scale=FP8_INPUT_SCALE, x_e4m3=True), "128x128w8", cluster=2),
    # BLOCK_K 128 over 128 channels on the warp-specialized kernel (the b8 default's 128x64, strided, 209 rows)
    _ws(ConvCase("x8_3x3_s2_c128_k128", 2, 128, 19, 21, 128, 3, 3, stride=2, pad=1, scale=True, residual=True,
                 post_activation="relu", input_scale=FP8_INPUT_SCALE, x_e4m3=True), "128x64w8"),
    # 192-row tiles on three MMA warpgroups: a part-filled last M tile (429 rows) and N tile (160 channels), a 2-CTA
    # reduction cluster (9 tiles as 4 + 5), FP8 with e4m3 X (BLOCK_K 128)
    _ws(ConvCase("3x3_c128_k160_m192", 3, 128, 11, 13, 160, 3, 3, pad=1, residual=True, post_activation="relu"),
        "192x128w12"),
    _ws(ConvCase("3x3_c64_k96_m192_c2_bf16", 2, 64, 10, 9, 96, 3, 3, pad=1, scale=True, **_WGMMA_BF16), "192x128w12",
        cluster=2),
    _ws(ConvCase("x8_3x3_c256_k128_m192", 2, 256, 7, 9, 128, 3, 3, pad=1, scale=True, input_scale=FP8_INPUT_SCALE,
                 x_e4m3=True), "192x128w12"),
    _ws(ConvCase("x8_3x3_c128_k160_m192", 2, 128, 11, 13, 160, 3, 3, pad=1, scale=True, input_scale=FP8_INPUT_SCALE,
                 x_e4m3=True), "192x128w12"),                                    # BLOCK_K 128 over 128 channels
    # 64-row tiles on one MMA warpgroup (256 threads, no register hand-over): odd M (198 rows: a part-filled last M
    # tile) with K/G 160 past a 128-column tile, a 9-tile 3x3 reduction around a 6-stage ring, BLOCK_K 32, 64x256 on a
    # 5-stage ring, two blocks per SM, reduction clusters of 3 (8 tiles as 2, 3, 3; 16-row blocks owned 1, 1, 2) and
    # 4 (one block each), FP8 with e4m3 X (BLOCK_K 128)
    _ws(ConvCase("1x1_c192_k160_m64", 2, 192, 9, 11, 160, 1, 1, residual=True, post_activation="relu"), "64x128w4"),
    _ws(ConvCase("3x3_c64_k96_b1_m64_bf16", 1, 64, 13, 11, 96, 3, 3, pad=1, scale=True, **_WGMMA_BF16), "64x64w4"),
    _ws(ConvCase("3x3_c96_k64_m64", 2, 96, 10, 9, 64, 3, 3, pad=1, activation="silu"), "64x64w4"),   # BLOCK_K 32
    _ws(ConvCase("1x1_c512_k256_m64", 1, 512, 7, 9, 256, 1, 1, residual=True), "64x256w4"),
    _ws(ConvCase("1x1_c256_k128_m64_2ctas_bf16", 2, 256, 9, 7, 128, 1, 1, scale=True, **_WGMMA_BF16), "64x128w4",
        ws_ctas=2),
    _ws(ConvCase("1x1_c512_k128_b1_m64", 1, 512, 9, 9, 128, 1, 1, residual=True, post_activation="relu"), "64x128w4",
        cluster=3),
    _ws(ConvCase("3x3_c64_k80_b1_m64", 1, 64, 9, 9, 80, 3, 3, pad=1, scale=True), "64x64w4", cluster=4),
    _ws(ConvCase("x8_1x1_c256_k128_m64", 2, 256, 7, 9, 128, 1, 1, scale=True, input_scale=FP8_INPUT_SCALE,
                 x_e4m3=True, activation="silu"), "64x128w4"),
    # FP8 with e4m3 X, the b32 candidates of session 11: wide tiles over 512 channels (BLOCK_K 128, 36 tiles) split
    # over 3- and 4-CTA clusters (192x128 c3: 126 rows, K/G 160 past a 128-column tile; 128x256 c4: 99 rows;
    # 256x128 c3 strided); 256x64 over 64 channels (663 rows); 128x64 at two blocks per SM (K/G 96)
    _ws(ConvCase("x8_3x3_c512_k160_c3", 2, 512, 7, 9, 160, 3, 3, pad=1, scale=True, residual=True,
                 post_activation="relu", input_scale=FP8_INPUT_SCALE, x_e4m3=True), "192x128w12", cluster=3),
    _ws(ConvCase("x8_3x3_c512_k256_c4", 1, 512, 9, 11, 256, 3, 3, pad=1, scale=True, input_scale=FP8_INPUT_SCALE,
                 x_e4m3=True), "128x256w8", cluster=4),
    _ws(ConvCase("x8_3x3_s2_c512_k128_c3", 3, 512, 13, 13, 128, 3, 3, stride=2, pad=1, scale=True, residual=True,
                 input_scale=FP8_INPUT_SCALE, x_e4m3=True), "256x128w8", cluster=3),
    _ws(ConvCase("x8_3x3_c64_k64_m256", 3, 64, 17, 13, 64, 3, 3, pad=1, scale=True, residual=True,
                 post_activation="relu", input_scale=FP8_INPUT_SCALE, x_e4m3=True), "256x64w8"),
    _ws(ConvCase("x8_3x3_c64_k96_2ctas", 2, 64, 15, 11, 96, 3, 3, pad=1, scale=True, input_scale=FP8_INPUT_SCALE,
                 x_e4m3=True), "128x64w8", ws_ctas=2),
]
