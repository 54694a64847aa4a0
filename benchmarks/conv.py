"""FusedConv vs the cuDNN frontend fused graph (the anchor: conv -> bias -> [add residual] -> activation, runtime
fusion, as TensorRT runs a conv) and vs torch's cuDNN convolution followed by the separate epilogue ops, every conv
layer of ResNet-50 and MobileNetV2 (224x224 input), batch 1, 8 and 32, float16 channels-last, one run on one GPU.

Anchor per layer (benchmarks/conv_anchor.py, needs the nvidia-cudnn-frontend wheel): a graph cuDNN does not build is
"n/a" with its reason. ``--quick``: ResNet-50 at batch 8 and 32, MobileNetV2 at 32, rows stop after 150 s; ``--json``
writes the rows for plugins/conv/tensorrt_choice.

Baseline per layer = what the unfused model runs: conv2d (cuDNN, benchmark mode), BatchNorm (eval), activation
(in place), and for residual layers the add and ReLU. Ours = one FusedConv launch with BatchNorm folded into W
and shift. Each side is timed as a CUDA graph of REPS calls (launch gaps as a deployed engine would see them),
median of TRIALS replays. Whole-stack sums weight each distinct layer by how often the network has it.

    python benchmarks/conv.py --out benchmarks/results/conv_h100.md
    python benchmarks/conv.py --quick --out benchmarks/results/conv_anchor_h100.md --json conv_anchor_h100.json
    python benchmarks/conv.py --fp8 --out benchmarks/results/conv_h100.md             # with the FP8 table
    python benchmarks/conv.py --sweep-only --sweep 32 --sweep-variants wgmma --out benchmarks/results/conv_wgmma_sweep_h100.md

FP8 table (``--fp8``/``--fp8-only``, sm_89+): the ResNet-50 3x3 layers with our FP8 FusedConv (BN-folded W in e4m3
with per-channel scales; X either float16 quantized in the kernel with a per-tensor scale, or "x8": already e4m3 in
memory as an FP8 producer writes it) against the same cuDNN FP16 baseline and our FP16 FusedConv, the plan's
default and a set of wgmma tiles each. Sweeps (``--sweep-only``): every variant of ``SWEEPS[...]`` per layer.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import re
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import trt_fusedattn
from conv_anchor import FusedGraph
from trt_fusedattn.launcher.compile import nvcc_version
from trt_fusedattn.launcher.launch import device_arch
from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.launcher.launch import launch, precompile
from trt_fusedattn.plugins.conv import plan as conv_plan
from trt_fusedattn.plugins.conv.plan import arch_number, plan_conv
from trt_fusedattn.plugins.conv.tensorrt_choice import TENSORRT_STAND_INS, ConvShape, choose

REPS, TRIALS, EPS = 20, 7, 1e-5
FP8_SCALE_X = 4.5 / 448  # X's per-tensor FP8 scale on randn inputs: |x| > 4.5 saturates (rare)
# Tile sweeps: (label, plan_conv overrides). mma.sync: every tile and BLOCK_K (the data behind default_gemm_tile);
# wgmma (sm_90a): warpgroup tiles, the cluster split of the reduction (c2, c4) and the taps-inner order (ti).
# Combinations a layer cannot take (taps-inner on a 1x1 filter, a tile over shared memory) are left out for it.
MMA_SYNC_SWEEP = [(f"{t}/{bk}", dict(tile=t, block_k=bk, mma="mma.sync"))
                  for t in ("128x128w4", "128x64w4", "64x128w4", "64x64w4", "128x32w4", "128x64w4s2", "128x32w4s2",
                            "64x64w4s2", "64x64w4s4") for bk in (32, 64)]
MMA_SYNC_SWEEP += [(f"{t}/64/4st", dict(tile=t, block_k=64, stages=4, mma="mma.sync"))
                   for t in ("128x64w4", "128x64w4s2", "128x32w4s2")]
WGMMA_SWEEP = [(label, dict(mma="wgmma", tile=label.split()[0], **kw)) for label, kw in [
    ("128x128w8", {}), ("128x256w8", {}), ("64x128w4", {}), ("128x64w4", {}), ("128x64w8", {}), ("64x256w4", {}),
    ("128x128w8s2", {}), ("128x128w8 6st", dict(stages=6)), ("128x128w8 ti", dict(taps_inner=True)),
    ("128x128w8 c2", dict(cluster=2)), ("128x128w8 c2 ti", dict(cluster=2, taps_inner=True)),
    ("128x256w8 c2", dict(cluster=2)), ("64x128w4 c2", dict(cluster=2)),
    ("128x128w8 c4 ti", dict(cluster=4, taps_inner=True)), ("64x256w4 c2", dict(cluster=2))]]
# wgmma_ws (sm_90a): the warp-specialized kernel (implicit_gemm_sm90.cu) on its 8-warp tiles, with cluster splits of
# the reduction (cN) and W tiles shared by M-tile pairs (sw).
WS_SWEEP = [(f"ws {label}", dict(mma="wgmma_ws", tile=label.split()[0], **kw)) for label, kw in [
    ("128x128w8", {}), ("128x256w8", {}), ("256x128w8", {}), ("128x64w8", {}), ("128x64w8 c2", dict(cluster=2)),
    ("128x64w8 c4", dict(cluster=4)), ("128x128w8 c2", dict(cluster=2)), ("128x64w8 x2", dict(ws_ctas=2)),
    ("128x64w8 c3", dict(cluster=3)), ("128x128w8 c3", dict(cluster=3)), ("128x128w8 c4", dict(cluster=4)),
    ("256x128w8 c2", dict(cluster=2)), ("128x256w8 c2", dict(cluster=2)),
    # sw: M-tile pairs sharing the W tile (share_w)
    ("128x128w8 sw", dict(share_w=True)), ("128x256w8 sw", dict(share_w=True)), ("256x128w8 sw", dict(share_w=True)),
    ("128x64w8 sw", dict(share_w=True))]]
WS_SWEEP += [(f"ws {label}", dict(mma="wgmma_ws", tile=label.split()[0], **kw)) for label, kw in [  # 3 MMA warpgroups
    ("192x128w12", {}), ("192x128w12 c2", dict(cluster=2)), ("192x128w12 c4", dict(cluster=4))]]
WS_SWEEP += [("wg default", dict(mma="wgmma")),  # the unspecialized loop: its channel rule, and a 4-CTA split
             ("wg 128x128w8 c4", dict(mma="wgmma", tile="128x128w8", cluster=4)),
             ("wg 64x128w4", dict(mma="wgmma", tile="64x128w4")), ("wg 128x64w4", dict(mma="wgmma", tile="128x64w4")),
             # a 3-stage ring (96 KB): two CTAs per SM, one's epilogue under the other's loads (short reductions)
             ("wg 128x128w8 3st", dict(mma="wgmma", tile="128x128w8", stages=3)),
             ("wg 128x128w8 4st", dict(mma="wgmma", tile="128x128w8", stages=4))]
# The WS kernel's M-tile rows (128, 192, 256) with and without cluster splits: the short sweep behind WS_TILE_COST.
WS_ROWS_SWEEP = [(label, kw) for label, kw in WS_SWEEP if label.split()[0] == "ws" and label.split()[1] in (
    "128x128w8", "256x128w8", "128x256w8", "192x128w12") and kw.keys() <= {"mma", "tile", "cluster"}]
# The WS kernel's 128-row tiles with and without reduction clusters of 2, 3, 4 CTAs: the sweep behind
# CLUSTER_CTA_CAP and the narrowing rule, for the deep layers at small batches.
WS_CLUSTER_SWEEP = [(label, kw) for label, kw in WS_SWEEP if label.split()[0] == "ws" and kw.get("tile") in (
    "128x64w8", "128x128w8") and kw.keys() <= {"mma", "tile", "cluster"}]
# The unspecialized wgmma loop's ring depth on short reductions (1-9 tiles): 3 stages let a third 128x64 CTA (72 KB)
# or a second 128x128 one (96 KB) share an SM; 4 keep more tiles in flight per CTA.
SHORT_SWEEP = [(f"wg {t} {st}st", dict(mma="wgmma", tile=t, stages=st)) for t in ("128x64w8", "128x128w8", "128x64w4")
               for st in (3, 4)]
# The stem's loaders: the tap-row gather with its registers capped for 4 blocks per SM (3 stages, or 4) or 3 (4
# stages), whatever the grid (plan constant TAP_ROWS_WAVE_COST set so that one count always wins), and the element
# gather it replaced.
_FOUR_BLOCKS, _THREE_BLOCKS = dict(TAP_ROWS_WAVE_COST={4: 1.0}), dict(TAP_ROWS_WAVE_COST={3: 1.0})
STEM_SWEEP = [("tap rows 4 blocks", dict(constants=_FOUR_BLOCKS)),
              ("tap rows 4 blocks 4st", dict(constants=_FOUR_BLOCKS, stages=4)),
              ("tap rows 3 blocks", dict(constants=_THREE_BLOCKS)),
              ("element gather", dict(tap_rows=False))]
# Short grids (b8): two warp-specialized blocks per SM (x2) on reduction clusters beside one (1x1 1024>256 @14 makes 52
# tiles of 128x64, whose 4-CTA clusters, 208 CTAs, fit at once only two an SM): each block's ring fill and cluster sum
# under the other's MMAs, at 80 registers a thread and half the shared memory; and 128x128 on 4-CTA clusters with a
# 5-stage ring, which leaves room for the pushed sums past it (6 stages do not).
SHORT_GRID_SWEEP = [(f"ws 128x64w8 x{ctas}" + (f" c{c}" if c > 1 else ""),
                     dict(mma="wgmma_ws", tile="128x64w8", ws_ctas=ctas, **({"cluster": c} if c > 1 else {})))
                    for ctas in (1, 2) for c in (1, 2, 3, 4)]
SHORT_GRID_SWEEP += [(f"ws 128x128w8 c4 {st}st", dict(mma="wgmma_ws", tile="128x128w8", cluster=4, stages=st))
                     for st in (5, 6)] + [("default, sums in the ring", dict(constants=dict(PUSHED_PAST_RING=False)))]
# Small grids (the 1x1 layers at batch 1 and 8): 64-row tiles on the warp-specialized kernel's one MMA warpgroup, twice
# the CTAs of 128-row tiles with the whole reduction each (cuDNN: b1 1x1 128>512 @28 +res on 52 CTAs of 64x128, b8 1x1
# 1024>256 @14 on 64x72 tiles, no split; ours 28 of 128x128, and 128x64 split over 2-CTA clusters), two blocks per SM
# (x2) and reduction clusters (cN); the unspecialized loop's 64x128 beside them.
SMALL_GRID_SWEEP = [(f"ws {label}", dict(mma="wgmma_ws", tile=label.split()[0], **kw)) for label, kw in [
    ("64x64w4", {}), ("64x128w4", {}), ("64x256w4", {}), ("64x64w4 x2", dict(ws_ctas=2)),
    ("64x64w4 c2", dict(cluster=2)), ("64x64w4 c4", dict(cluster=4)), ("64x128w4 c2", dict(cluster=2)),
    ("64x128w4 c4", dict(cluster=4))]]
SMALL_GRID_SWEEP += [("wg 64x128w4", dict(mma="wgmma", tile="64x128w4"))]
# Deep rings (b8's 16-tile 1x1 reductions and 3x3 256 @14): the WS ring past its 6-stage cap where the stages are small
# (cuDNN's graph runs b8 1x1 1024>256 @14 as 64x72 tiles on a 12-stage ring, session 7 ncu), on the 64-row tiles and
# 128x64, with the plan's cluster choice beside the forced ones.
DEEP_RING_SWEEP = [(f"ws {t}" + (f" c{c}" if c > 1 else "") + f" {st}st",
                    dict(mma="wgmma_ws", tile=t, stages=st, **({"cluster": c} if c > 1 else {})))
                   for t, c, depths in (("64x64w4", 1, (4, 6, 8, 10, 12)), ("64x128w4", 1, (6, 8)),
                                        ("64x64w4", 2, (6, 10)), ("64x128w4", 2, (6, 8)), ("128x64w8", 1, (6, 9)),
                                        ("128x64w8", 2, (6, 9)), ("64x256w4", 4, (5,)))
                   for st in depths]
# Depthwise: output pixels per thread (more pixels per block re-read fewer halo rows of X from L2).
DEPTHWISE_SWEEP = [(f"dw {p} px", dict(dw_pixels=p)) for p in (1, 2, 4)]
# Depthwise channel chunks per block: every chunk of a 96/144/192-channel layer in one block (12/18/24 chunks of 8: a
# warp's loads then cover whole pixels, contiguous in NHWC; 256 % CHUNKS threads idle) beside the plan's default.
DEPTHWISE_CHUNK_SWEEP = [("dw default", dict(dw_pixels=None))] + [
    (f"dw {c} chunks {p} px", dict(dw_chunks=c, dw_pixels=p)) for c in (12, 18, 24) for p in (1, 2)]
SWEEPS = {"mma.sync": MMA_SYNC_SWEEP, "wgmma": WGMMA_SWEEP, "wgmma_ws": WS_SWEEP, "ws_rows": WS_ROWS_SWEEP,
          "ws_cluster": WS_CLUSTER_SWEEP, "short": SHORT_SWEEP, "stem": STEM_SWEEP, "short_grids": SHORT_GRID_SWEEP,
          "depthwise": DEPTHWISE_SWEEP, "small_grids": SMALL_GRID_SWEEP, "deep_rings": DEEP_RING_SWEEP,
          "depthwise_chunks": DEPTHWISE_CHUNK_SWEEP}
BATCHES = (1, 8, 32)
QUICK_BATCHES = {"ResNet-50": (8, 32), "MobileNetV2": (32,)}  # --quick: the lead's one run in under 4 minutes
# FP8 variants timed per layer: (label, plan_conv overrides); "default" is the plan's choice. "x8": X already e4m3 in
# global memory (as an FP8 producer writes it), the others quantize float16 X in the kernel.
FP8_VARIANTS = [("default", dict()), ("x8 default", dict(x_e4m3=True))] + [
    (prefix + label, dict(mma="wgmma", tile=label.split()[0], **kw, **extra))
    for prefix, extra in (("", {}), ("x8 ", dict(x_e4m3=True)))
    for label, kw in [("128x128w8", {}), ("128x64w4", {}), ("128x64w8", {}), ("64x128w4", {}),
                      ("128x128w8 c2", dict(cluster=2)), ("64x128w4 c2", dict(cluster=2)),
                      ("128x128w8 bk128", dict(block_k=128)), ("128x256w8 bk128", dict(block_k=128)),
                      ("128x128w8 bk128 c2", dict(block_k=128, cluster=2)), ("128x64w8 bk128", dict(block_k=128)),
                      ("64x128w4 bk128 c2", dict(block_k=128, cluster=2))]]
# e4m3 X on the warp-specialized kernel (the plan's default there only on small grids), BLOCK_K by the plan's rule
FP8_VARIANTS += [(f"x8 ws {label}", dict(mma="wgmma_ws", tile=label.split()[0], x_e4m3=True, **kw)) for label, kw in [
    ("128x128w8", {}), ("256x128w8", {}), ("128x256w8", {}), ("128x64w8", {}), ("128x128w8 c2", dict(cluster=2)),
    ("128x64w8 c2", dict(cluster=2)), ("128x64w8 c3", dict(cluster=3)), ("192x128w12", {}),
    ("192x128w12 c2", dict(cluster=2)),
    # wide tiles split before narrowing (float16's rule for deep reductions, not yet FP8's): b8 on 256 channels, b32 on 512
    ("128x128w8 c3", dict(cluster=3)), ("128x128w8 c4", dict(cluster=4)), ("128x256w8 c2", dict(cluster=2)),
    ("128x256w8 c4", dict(cluster=4)),
    # 64-row tiles on one MMA warpgroup (b8's short grids: twice the CTAs of a 128-row tile per reduction split)
    ("64x64w4 c2", dict(cluster=2)), ("64x64w4 c4", dict(cluster=4)), ("64x128w4 c2", dict(cluster=2)),
    ("64x128w4 c4", dict(cluster=4)), ("64x256w4 c4", dict(cluster=4))]]
# Session 10, the FP8 targets (e4m3 X): BLOCK_K 128 on the 128-channel layers (half the tiles, twice the MMAs a
# hand-over: b8 on WS 128x64, on 64x64 one-warpgroup tiles and on the unspecialized 128x64; b32 on WS 192x128); the b8
# 256/512-channel 64x64 c2 default on a 4-stage ring; b32's 64-channel layer on one warpgroup with 3 stages, and with A
# through L1 (taps inner).
FP8_VARIANTS += [(f"x8 {label}", dict(x_e4m3=True, **kw)) for label, kw in [
    ("ws 128x64w8 bk128", dict(mma="wgmma_ws", tile="128x64w8", block_k=128)),
    ("ws 64x64w4 bk128", dict(mma="wgmma_ws", tile="64x64w4", block_k=128, cluster=1)),
    ("ws 192x128w12 bk128", dict(mma="wgmma_ws", tile="192x128w12", block_k=128)),
    ("ws 64x64w4 c2 4st", dict(mma="wgmma_ws", tile="64x64w4", cluster=2, stages=4)),
    ("128x64w4 3st", dict(mma="wgmma", tile="128x64w4", stages=3)),
    ("128x64w8 ti", dict(mma="wgmma", tile="128x64w8", taps_inner=True)),
    # v10b: the unspecialized loop's cluster sums past its ring (b32 512-channel 2-CTA split); this column keeps them
    # in the ring's bytes as before
    ("default sums in ring", dict(constants=dict(PUSHED_PAST_RING_UNSPECIALIZED=False)))]]
# Session 11, the b32 FP8 layers short of 1.5x (e4m3 X): the 512-channel pair on wider WS tiles over the cluster split
# (fewer operand bytes from L2 per MAC than 128x128 c2's 104 CTAs); 3x3 64 @56 on tiles that make whole waves of its
# 784 128x64 tiles (3 an SM on a 6-stage ring: 2 waves; 256-row tiles: 392 CTAs; 64-row: 1568) and on the WS kernel.
FP8_VARIANTS += [(f"x8 {label}", dict(x_e4m3=True, **kw)) for label, kw in [
    ("ws 192x128w12 c3", dict(mma="wgmma_ws", tile="192x128w12", cluster=3)),
    ("ws 256x128w8 c3", dict(mma="wgmma_ws", tile="256x128w8", cluster=3)),
    ("ws 256x128w8 c4", dict(mma="wgmma_ws", tile="256x128w8", cluster=4)),
    ("128x64w8 ti 6st", dict(mma="wgmma", tile="128x64w8", taps_inner=True, stages=6)),
    # the shallowest ring (36 / 60 KB): less shared memory an SM, so more of its 256 KB is L1 for the taps' re-reads
    ("128x64w8 ti 3st", dict(mma="wgmma", tile="128x64w8", taps_inner=True, stages=3)),
    ("256x64w8 ti 3st", dict(mma="wgmma", tile="256x64w8", taps_inner=True, stages=3)),
    ("256x64w8 ti", dict(mma="wgmma", tile="256x64w8", taps_inner=True)),
    ("64x64w4 ti", dict(mma="wgmma", tile="64x64w4", taps_inner=True)),
    ("ws 128x64w8 ctas2", dict(mma="wgmma_ws", tile="128x64w8", ws_ctas=2)),
    ("ws 256x64w8", dict(mma="wgmma_ws", tile="256x64w8")),
    # after conv-1 (ncu: the 512-channel pair latency-bound at 12 warps an SM, 104 of 132 SMs busy; 3x3 64 @56 issue-
    # bound): the pair on two WS blocks an SM (208 / 200 CTAs over all SMs); 256x64 on 5 stages and without taps inner
    ("ws 128x64w8 c2 ctas2", dict(mma="wgmma_ws", tile="128x64w8", cluster=2, ws_ctas=2)),
    ("ws 64x128w4 c2 ctas2", dict(mma="wgmma_ws", tile="64x128w4", cluster=2, ws_ctas=2)),
    ("ws 64x64w4 ctas2", dict(mma="wgmma_ws", tile="64x64w4", cluster=1, ws_ctas=2)),
    ("256x64w8 ti 5st", dict(mma="wgmma", tile="256x64w8", taps_inner=True, stages=5)),
    ("256x64w8", dict(mma="wgmma", tile="256x64w8", taps_inner=False))]]
# With --prev-kernels DIR: the previous rule's plan (PREVIOUS_RULE) on DIR's kernel sources (an earlier tree), a column
# beside this tree's default.
FP8_PREVIOUS_KERNELS_LABEL = "x8 default prev"
# ... and this tree's rule (the default plan) on DIR's kernels: the kernel change alone, beside the rule's.
FP8_DEFAULT_ON_PREVIOUS_KERNELS_LABEL = "x8 default, prev kernels"


@dataclass(frozen=True)
class Layer:
    """One conv layer with its epilogue: act after BN ('relu', 'relu6', 'none'); residual: add then ReLU (ResNet)
    or plain add (MobileNetV2)."""

    net: str
    c: int
    k: int
    hw: int
    kernel: int
    stride: int = 1
    groups: int = 1
    act: str = "relu"
    residual: bool = False

    @property
    def pad(self) -> int:
        return self.kernel // 2

    @property
    def out_hw(self) -> int:
        return (self.hw + 2 * self.pad - self.kernel) // self.stride + 1

    @property
    def name(self) -> str:
        kind = "dw" if self.groups > 1 else f"{self.kernel}x{self.kernel}"
        stride = f"/{self.stride}" if self.stride > 1 else ""
        return f"{kind}{stride} {self.c}>{self.k} @{self.hw}" + (" +res" if self.residual else "")

    def flops(self, n: int) -> int:
        return 2 * n * self.out_hw ** 2 * self.k * self.c // self.groups * self.kernel ** 2


def resnet50() -> list[tuple[Layer, int]]:
    L = lambda *a, **k: Layer("ResNet-50", *a, **k)  # noqa: E731
    layers = [(L(3, 64, 224, 7, 2), 1)]
    hw, cin = 56, 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        out = width * 4
        layers += [(L(cin, width, hw, 1), 1), (L(width, width, hw, 3, stride), 1)]
        hw_out = hw // stride
        layers += [(L(cin, out, hw, 1, stride, act="none"), 1)]  # projection shortcut
        layers += [(L(out, width, hw_out, 1), blocks - 1), (L(width, width, hw_out, 3), blocks - 1)]
        layers += [(L(width, out, hw_out, 1, act="none", residual=True), blocks)]
        hw, cin = hw_out, out
    return _merge(layers)


def mobilenet_v2() -> list[tuple[Layer, int]]:
    L = lambda *a, **k: Layer("MobileNetV2", *a, **k)  # noqa: E731
    layers = [(L(3, 32, 224, 3, 2, act="relu6"), 1)]
    cin, hw = 32, 112
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)):
        for i in range(n):
            stride, hidden = (s if i == 0 else 1), cin * t
            if t != 1:
                layers.append((L(cin, hidden, hw, 1, act="relu6"), 1))
            layers.append((L(hidden, hidden, hw, 3, stride, groups=hidden, act="relu6"), 1))
            hw_out = (hw - 1) // stride + 1
            layers.append((L(hidden, c, hw_out, 1, act="none", residual=stride == 1 and cin == c), 1))
            cin, hw = c, hw_out
    layers.append((L(320, 1280, 7, 1, act="relu6"), 1))
    return _merge(layers)


def _merge(layers):
    counts: dict[Layer, int] = {}
    for layer, n in layers:
        if n:
            counts[layer] = counts.get(layer, 0) + n
    return list(counts.items())


def _fused_activation(layer: Layer) -> dict:
    act = {"relu": dict(activation="relu"), "relu6": dict(activation="clip", activation_alpha=0.0,
                                                           activation_beta=6.0), "none": {}}[layer.act]
    if layer.residual:
        act["post_activation"] = "relu" if layer.net == "ResNet-50" else "none"
    return act


class Case:
    """Random inputs of one layer at one batch, and the two ways to compute it."""

    def __init__(self, layer: Layer, n: int):
        self.layer, self.n = layer, n
        cl = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
        dev = dict(device="cuda", dtype=torch.half)
        self.x = cl(torch.randn(n, layer.c, layer.hw, layer.hw, **dev))
        fan_in = layer.c // layer.groups * layer.kernel ** 2
        self.w = cl(torch.randn(layer.k, layer.c // layer.groups, layer.kernel, layer.kernel, **dev) / fan_in ** .5)
        f32 = dict(device="cuda", dtype=torch.float32)
        self.gamma, self.beta = torch.rand(layer.k, **f32) + 0.5, torch.randn(layer.k, **f32) * 0.1
        self.mean, self.var = torch.randn(layer.k, **f32) * 0.1, torch.rand(layer.k, **f32) + 0.5
        inv = self.gamma / torch.sqrt(self.var + EPS)
        self.w_folded = cl((self.w.float() * inv[:, None, None, None]).half())
        self.shift = (self.beta - self.mean * inv).contiguous()
        o = layer.out_hw
        self.residual = cl(torch.randn(n, layer.k, o, o, **dev)) if layer.residual else None
        self.out = cl(torch.empty(n, layer.k, o, o, **dev))

    def baseline(self):
        lay = self.layer
        y = F.conv2d(self.x, self.w, None, lay.stride, lay.pad, 1, lay.groups)
        y = F.batch_norm(y, self.mean, self.var, self.gamma, self.beta, False, 0.0, EPS)
        if lay.act == "relu":
            y = F.relu_(y)
        elif lay.act == "relu6":
            y = F.hardtanh_(y, 0.0, 6.0)
        if lay.residual:
            y += self.residual
            if lay.net == "ResNet-50":
                y = F.relu_(y)
        return y

    def anchor(self, stream: torch.cuda.Stream) -> FusedGraph:
        """The cuDNN frontend fused graph of this layer on this case's tensors (BN folded as for ours)."""
        lay = self.layer
        self.anchor_out = torch.empty_like(self.out)
        return FusedGraph(self.x, self.w_folded, self.shift.half(), self.residual, self.anchor_out,
                          stride=lay.stride, pad=lay.pad, act=lay.act,
                          post_relu=lay.residual and lay.net == "ResNet-50", stream=stream)

    def fused(self):
        lay = self.layer
        return trt_fusedattn.conv2d(self.x, self.w_folded, self.shift, stride=lay.stride, padding=lay.pad,
                                    groups=lay.groups, residual=self.residual, out=self.out,
                                    **_fused_activation(lay))


def layer_plan(lay: Layer, n: int, arch: str, input_scale: float = 0.0, x_e4m3: bool = False,
               output_scale: float = 0.0, constants: dict | None = None, **tile):
    """The FusedConv plan of one layer (what ``Case.fused`` launches; ``tile``: plan_conv's tuning override;
    ``input_scale`` != 0: the FP8 plan, e4m3 W with a per-channel scale; ``x_e4m3``: X already e4m3;
    ``output_scale`` != 0: Y written in e4m3, an FP8 chain's producer; ``constants``: plan constants for this plan,
    see plan_constants)."""
    o = lay.out_hw
    attrs = FUSED_CONV.resolve(dict(strides=(lay.stride,) * 2, pads=(lay.pad,) * 4, group=lay.groups,
                                    input_scale=input_scale, output_scale=output_scale, **_fused_activation(lay)))
    shapes = [(n, lay.c, lay.hw, lay.hw), (lay.k, lay.kernel, lay.kernel, lay.c // lay.groups), (lay.k,),
              (lay.k,) if input_scale else None, (n, lay.k, o, o) if lay.residual else None]
    dtypes = ["float8_e4m3fn" if x_e4m3 else "float16", "float8_e4m3fn" if input_scale else "float16", "float32",
              "float32" if input_scale else None,
              "float16" if lay.residual else None]
    with plan_constants(constants or {}):
        return plan_conv(shapes, dtypes, attrs, arch, **tile)


def fp8_operands(case: Case, scale_x: float) -> tuple:
    """The FP8 operands of a case: X in e4m3 (channels-last kept, as an FP8 producer writes it) and the kernel's
    pointers (float16 X, e4m3 BN-folded W, shift, W's per-channel scales, residual); the tensors stay alive on
    ``case``."""
    case.w_scale = (case.w_folded.float().abs().amax(dim=(1, 2, 3)) / 448).contiguous()
    case.w8 = (case.w_folded.float() / case.w_scale[:, None, None, None]).to(torch.float8_e4m3fn)
    assert case.w8.is_contiguous(memory_format=torch.channels_last)  # OHWI in memory, as the kernel reads it
    case.x8 = (case.x.float() / scale_x).clamp(-448, 448).to(torch.float8_e4m3fn)
    ptrs = [case.x.data_ptr(), case.w8.data_ptr(), case.shift.data_ptr(), case.w_scale.data_ptr(),
            None if case.residual is None else case.residual.data_ptr()]
    return case.x8, ptrs


def takes_fp8_x8(lay: Layer, arch: str) -> bool:
    """The anchor table's FP8 column: dense 3x3 layers whose X can be e4m3 (C/G % 16 == 0) on an FP8 GPU."""
    return arch_number(arch) >= 89 and lay.groups == 1 and lay.kernel == 3 and lay.c % 16 == 0


def fp8_x8_us(case: Case, arch: str, want: torch.Tensor) -> dict:
    """Our FP8 FusedConv with e4m3 X (the plan's default) on a case: its time and error against the FP16 eager
    result (fp8_us None where the error says the kernel is wrong)."""
    x8, ptrs = fp8_operands(case, FP8_SCALE_X)
    plan = layer_plan(case.layer, case.n, arch, FP8_SCALE_X, x_e4m3=True)
    fn = lambda: launch(plan, arch, [x8.data_ptr(), *ptrs[1:]], [case.out.data_ptr()],  # noqa: E731
                        stream=torch.cuda.current_stream().cuda_stream)
    case.out.fill_(float("nan"))
    fn()
    err = float((case.out.float() - want).norm() / want.norm())
    return dict(fp8_us=time_us(fn) if err < 0.1 else None, fp8_err=err)


def cudnn_depthwise_act_us(case: Case) -> float:
    """cuDNN's depthwise conv with BatchNorm folded into W and bias, then the activation in place: the strongest
    eager reference for a depthwise layer (cuDNN's fused graph is far slower there)."""
    lay, bias = case.layer, case.shift.half()

    def run():
        y = F.conv2d(case.x, case.w_folded, bias, lay.stride, lay.pad, 1, lay.groups)
        return F.hardtanh_(y, 0.0, 6.0) if lay.act == "relu6" else F.relu_(y) if lay.act == "relu" else y
    return time_us(run)


def fp8_table(layers: list, batches: list, arch: str, only: str | None = None) -> list[str]:
    """Our FP8 FusedConv (every FP8_VARIANTS entry; ``only``: those whose label matches this regex) beside cuDNN FP16
    + epilogue and our FP16 FusedConv on ``layers``; err = |fp8 - base| / |base| normwise (mostly the e4m3
    quantization of X and W)."""
    fp8_variants = [(label, kw) for label, kw in FP8_VARIANTS if only is None or re.search(only, label)]
    if PREVIOUS_KERNELS is not None:
        fp8_variants += [(FP8_PREVIOUS_KERNELS_LABEL, dict(x_e4m3=True, constants=PREVIOUS_RULE)),
                         (FP8_DEFAULT_ON_PREVIOUS_KERNELS_LABEL, dict(x_e4m3=True))]
    if arch_number(arch) < 89:
        return [f"\nFP8 FusedConv needs sm_89+ (e4m3 tensor cores); this GPU is {arch}: no FP8 table."]
    scale_x = FP8_SCALE_X
    variants = {(lay, label, n): plan for lay in layers for n in batches for label, kw in fp8_variants
                for plan in [_plan_or_none(lay, arch, scale_x, n=n, **kw)] if plan is not None}
    for (lay, label, n), plan in variants.items():
        if label in (FP8_PREVIOUS_KERNELS_LABEL, FP8_DEFAULT_ON_PREVIOUS_KERNELS_LABEL):
            variants[lay, label, n] = dataclasses.replace(plan, source=PREVIOUS_KERNELS / plan.source.name)
    precompile(variants.values(), arch, workers=16)  # nvcc and the driver's JIT, in parallel, before timing
    labels = [label for label, _ in fp8_variants]
    lines = ["\n## FP8 (E4M3) FusedConv on the ResNet-50 3x3 layers\n",
             f"X quantized in the kernel from float16 (input_scale {scale_x:.4g}), or \"x8\": X already e4m3 in "
             "memory as an FP8 producer writes it; BN-folded W in e4m3 with per-channel scales, fp32 accumulation, "
             "fp16 output. base = cuDNN FP16 conv + BN + ReLU; graph = the cuDNN fused FP16 graph (the issue's "
             "anchor); fp16 = our FP16 FusedConv; best = fastest FP8 variant (µs per call)"
             + (f"; \"{FP8_PREVIOUS_KERNELS_LABEL}\" = the previous rule's plan ({PREVIOUS_RULE_TEXT}) on "
                f"{PREVIOUS_KERNELS}'s kernel sources, \"{FP8_DEFAULT_ON_PREVIOUS_KERNELS_LABEL}\" = this rule's plan on them"
                if PREVIOUS_KERNELS else "") + ".\n",
             "| layer | batch | base µs | graph µs | fp16 µs | " + " | ".join(f"fp8 {l} µs" for l in labels)
             + " | best fp8 | vs base | vs graph | vs fp16 | best TFLOP/s | err |",
             "|---|---:|---:|---:|---:|" + "---:|" * len(labels) + "---|---:|---:|---:|---:|---:|"]
    stream = torch.cuda.Stream()
    for lay in layers:
        for n in batches:
            case = Case(lay, n)
            want = case.baseline().float()
            row = time_layer(case, stream)
            base, graph, fp16 = row["base_us"], row["graph_us"], row["ours_us"]
            x8, ptrs = fp8_operands(case, scale_x)
            times, errs = {}, {}
            for label, kw in fp8_variants:
                if (lay, label, n) not in variants:
                    times[label], errs[label] = float("inf"), float("nan")
                    continue
                plan = variants[lay, label, n]
                args = [x8.data_ptr(), *ptrs[1:]] if kw.get("x_e4m3") else ptrs
                fn = lambda plan=plan, args=args: launch(  # noqa: E731
                    plan, arch, args, [case.out.data_ptr()], stream=torch.cuda.current_stream().cuda_stream)
                case.out.fill_(float("nan"))
                fn()
                errs[label] = float((case.out.float() - want).norm() / want.norm())
                times[label] = time_us(fn) if errs[label] < 0.1 else float("inf")  # a wrong kernel is not timed
            best = min(times, key=times.get)
            vs_graph = "n/a" if graph is None else f"{graph / times[best]:.2f}x"
            lines.append(f"| {lay.name} | {n} | {base:.1f} | {'n/a' if graph is None else f'{graph:.1f}'} | "
                         f"{fp16:.1f} | "
                         + " | ".join(f"{times[l]:.1f}" if times[l] < float("inf") else
                                      "-" if errs[l] != errs[l] else f"wrong ({errs[l]:.1e})" for l in labels)
                         + f" | {best} | {base / times[best]:.2f}x | {vs_graph} | {fp16 / times[best]:.2f}x | "
                         f"{lay.flops(n) / times[best] / 1e6:.0f} | {errs[best]:.1e} |")
            print(lines[-1], flush=True)
            del case
    return lines


def time_us(fn, stream: torch.cuda.Stream | None = None) -> float:
    """Median time of one call, from CUDA-graph replays of REPS calls (captured on ``stream`` if given: a library
    handle bound to one stream must launch there)."""
    side = stream or torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(REPS):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(TRIALS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / REPS)
    return statistics.median(times)


def time_us_eager(fn, stream: torch.cuda.Stream) -> float:
    """Median time of one call from cudaEvents around REPS back-to-back calls on ``stream`` (the fallback where a
    library call cannot be captured into a CUDA graph; includes launch gaps the graph would hide)."""
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(TRIALS):
            start.record()
            for _ in range(REPS):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000 / REPS)
    return statistics.median(times)


def environment() -> str:
    props = torch.cuda.get_device_properties(0)
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        driver = "?"
    nvcc = nvcc_version().strip().splitlines()[-1]
    return (f"{props.name} ({props.multi_processor_count} SMs), driver {driver}, torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}), our PTX by {nvcc}, "
            f"arch {device_arch(0)}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")


def _plan_or_none(lay: Layer, arch: str, input_scale: float = 0.0, n: int = 1, **tile):
    """layer_plan at batch n, or None where the layer cannot take these overrides (wgmma asked for but not
    possible: the element gather)."""
    try:
        plan = layer_plan(lay, n, arch, input_scale, **tile)
    except ValueError:
        return None
    return None if tile.get("mma") in ("wgmma", "wgmma_ws") and "WGMMA" not in plan.defines else plan


def plan_call(case: "Case", plan, arch: str):
    """One launch of ``plan`` (a tuning variant of the layer) on the case's tensors, as a callable."""
    ptrs = [case.x.data_ptr(), case.w_folded.data_ptr(), case.shift.data_ptr(), None,
            None if case.residual is None else case.residual.data_ptr()]
    return lambda: launch(plan, arch, ptrs, [case.out.data_ptr()], stream=torch.cuda.current_stream().cuda_stream)


def sweep(nets: dict, batches: list, arch: str, variants: list, only: list[str] | None = None) -> list[str]:
    """Time every variant (label, plan_conv overrides) on every non-depthwise layer, or every depthwise one for
    depthwise variants (``only``: the layers of these names): the data behind the plan's default choices. Rows:
    layer, batch, base, the cuDNN fused graph, default's time, best variant and its time and its speed over the
    graph, all times."""
    depthwise = all("dw_pixels" in kw for _, kw in variants)
    nets = {net: [(lay, count) for lay, count in layers if (lay.groups > 1 and lay.groups == lay.c) == depthwise
                  and (not only or lay.name in only)] for net, layers in nets.items()}
    plans = {(lay, label, n): plan for layers in nets.values() for lay, _ in layers for n in batches
             for label, kw in variants for plan in [_plan_or_none(lay, arch, n=n, **kw)] if plan is not None}
    precompile(plans.values(), arch, workers=16)  # nvcc and the driver's JIT, in parallel, before timing
    lines = ["\n## Sweep (implicit-GEMM layers; µs)\n",
             "| net | layer | batch | base | graph | default | best | best variant | best vs graph | all (variant: µs) |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---|"]
    stream = torch.cuda.Stream()
    for net, layers in nets.items():
        for lay, _ in layers:
            for n in batches:
                case = Case(lay, n)
                row = time_layer(case, stream)
                base, default, graph = row["base_us"], row["ours_us"], row["graph_us"]
                want = case.baseline().float()
                times = {}
                for label, kw in variants:
                    if (lay, label, n) not in plans:
                        continue
                    fn = plan_call(case, plans[lay, label, n], arch)
                    case.out.fill_(float("nan"))
                    fn()
                    err = float((case.out.float() - want).norm() / want.norm())
                    times[label] = time_us(fn) if err < 1e-2 else float("inf")  # a wrong kernel is not timed
                if not times:  # no variant applies (wgmma on the element gather)
                    continue
                best = min(times, key=times.get)
                graph_cells = ("n/a", "n/a") if graph is None else (f"{graph:.1f}", f"{graph / times[best]:.2f}x")
                lines.append(f"| {net} | {lay.name} | {n} | {base:.1f} | {graph_cells[0]} | {default:.1f} | "
                             f"{times[best]:.1f} | {best} | {graph_cells[1]} | "
                             + ", ".join(f"{k}: {v:.1f}" for k, v in times.items()) + " |")
                print(lines[-1], flush=True)
                del case
    return lines


def table_rows(nets: dict, batches_of: dict, arch: str, budget_s: float | None, lines: list[str], checkpoint):
    """Time every layer of ``nets`` three ways (eager cuDNN + epilogue ops, the cuDNN fused graph, ours), appending
    markdown rows to ``lines`` as they come and calling ``checkpoint(rows)`` after each (a crash keeps what was
    measured). Returns (rows as dicts, n/a reasons -> where, stack sums)."""
    start, rows, reasons, sums = time.monotonic(), [], {}, {}
    stream = torch.cuda.Stream()
    for net, layers in nets.items():
        lines += [f"\n## {net}\n", "| layer | count | batch | base µs | graph µs | fused µs | main loop | prev µs | vs base "
                  "| vs graph | fused TFLOP/s | err | graph err |",
                  "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
        for lay, count in layers:
            for n in batches_of[net]:
                if budget_s is not None and time.monotonic() - start > budget_s:
                    reasons.setdefault("not run (time budget)", []).append(f"{net} {lay.name} b{n}")
                    continue
                case = Case(lay, n)
                row = time_layer(case, stream)
                row.update(previous_loop(case, arch))
                row.update(fp8_us=None, fp8_err=None, dw_cudnn_us=None)
                if takes_fp8_x8(lay, arch):
                    row.update(fp8_x8_us(case, arch, case.baseline().float()))
                if lay.groups > 1:
                    row["dw_cudnn_us"] = cudnn_depthwise_act_us(case)
                row.update(net=net, count=count, batch=n, layer=lay.name, c=lay.c, k=lay.k, hw=lay.hw,
                           kernel=lay.kernel, stride=lay.stride, groups=lay.groups, act=lay.act,
                           residual=lay.residual)
                rows.append(row)
                if row["graph_reason"]:
                    reasons.setdefault(row["graph_reason"], []).append(f"{net} {lay.name} b{n}")
                s = sums.setdefault((net, n), dict(base=0.0, ours=0.0, prev=0.0, graph=0.0, ours_with_graph=0.0,
                                                   engine=0.0, missing=0, worst=(99.0, "")))
                s["base"] += count * row["base_us"]
                s["ours"] += count * row["ours_us"]
                s["prev"] += count * (row["ours_us"] if row["prev_us"] is None else row["prev_us"])
                graph = row["graph_us"]
                if graph is None:
                    s["missing"] += 1
                else:
                    s["graph"] += count * graph
                    s["ours_with_graph"] += count * row["ours_us"]
                    s["engine"] += count * engine_us(row, lay, n, arch)
                    s["worst"] = min(s["worst"], (graph / row["ours_us"], lay.name))
                graph_cell = "n/a" if graph is None else f"{graph:.1f}" + (" ev" if row["graph_eager"] else "")
                vs_graph = "n/a" if graph is None else f"{graph / row['ours_us']:.2f}x"
                graph_err = "n/a" if row["graph_err"] is None else f"{row['graph_err']:.1e}"
                prev = "=" if row["prev_us"] is None else f"{row['prev_us']:.1f}"
                lines.append(f"| {lay.name} | {count} | {n} | {row['base_us']:.1f} | {graph_cell} | "
                             f"{row['ours_us']:.1f} | {row['main_loop']} | {prev} | "
                             f"{row['base_us'] / row['ours_us']:.2f}x | {vs_graph} | "
                             f"{lay.flops(n) / row['ours_us'] / 1e6:.0f} | {row['err']:.1e} | {graph_err} |")
                print(lines[-1], flush=True)
                checkpoint(rows)
    return rows, reasons, sums


# The previous session's rule, as the plan constants that changed since: the "prev" column (FP16 and depthwise plans;
# the FP8 table's "x8 default prev" with --prev-kernels). Session 11: FP8 e4m3 X at batch 1, 64x64 unsplit at BLOCK_K
# 128 on 3x3 layers of <= 9 reduction tiles; 256x64 tiles for taps inner over 64 channels (b32 3x3 64 @56).
PREVIOUS_RULE: dict = {"FP8_ROWS64_SHORT_MAX_TILES": 0, "FP8_ROWS256_TAPS_INNER": False}
PREVIOUS_RULE_TEXT = ("FP8 e4m3 X: b1 3x3 layers on session 10's tiles (no 64x64 unsplit at BLOCK_K 128), b32 3x3 64 @56 "
                      "on 128x64 taps inner")
# --prev-kernels DIR: the "prev" plans compile from DIR's copies of the kernel sources (an earlier tree's
# plugins/conv), so that a kernel change is timed against the kernels before it with the same plans, in the same run.
PREVIOUS_KERNELS: Path | None = None


@contextlib.contextmanager
def plan_constants(values: dict):
    """plan_conv with these module constants of the conv plan (name -> value) inside the ``with``: the previous rule
    (PREVIOUS_RULE), or a sweep variant of a constant that no plan_conv argument overrides."""
    saved = {name: getattr(conv_plan, name) for name in values}
    for name, value in values.items():
        setattr(conv_plan, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(conv_plan, name, value)


def previous_plan(lay: Layer, n: int, arch: str):
    """The layer's plan under the previous rule, or None where it equals today's (same kernel and defines)."""
    with plan_constants(PREVIOUS_RULE):
        before = layer_plan(lay, n, arch)
    if PREVIOUS_KERNELS is not None:
        before = dataclasses.replace(before, source=PREVIOUS_KERNELS / before.source.name)
    now = layer_plan(lay, n, arch)
    return None if (before.source, before.defines) == (now.source, now.defines) else before


def previous_loop(case: Case, arch: str) -> dict:
    """Which main loop the plan runs ("ws": the warp-specialized Hopper kernel, "wgmma", "mma.sync", "dw"; "sw": M-tile
    pairs sharing W; "Nst": the ring's stages on the unspecialized wgmma loop; "trN": the tap-row gather for N blocks
    per SM) and the time of what the previous rule ran (prev_us; None where that is the same kernel)."""
    lay = case.layer
    d = layer_plan(lay, case.n, arch).defines
    loop = ("ws" if d.get("WARP_SPECIALIZED") else "wgmma" if d.get("WGMMA") else
            "dw" if "CH_MULT" in d else "mma.sync")
    loop += f" {d['BLOCK_M']}x{d['BLOCK_N']}" + (f" c{d['CLUSTER_K']}" if d.get("CLUSTER_K") else "") \
        + (" sw" if d.get("SHARE_W") else "") if "BLOCK_M" in d else ""
    loop += f" {d['STAGES']}st" if d.get("WGMMA") and not d.get("WARP_SPECIALIZED") else ""
    loop += f" tr{d['TAP_ROWS_BLOCKS']}" if d.get("TAP_ROWS") else ""
    before = previous_plan(lay, case.n, arch)
    return dict(main_loop=loop, prev_us=None if before is None else time_us(plan_call(case, before, arch)))


def time_layer(case: Case, stream: torch.cuda.Stream) -> dict:
    """One layer at one batch: errors against the eager baseline and the three times (graph None where cuDNN
    did not build or run its fused graph; the reason in graph_reason)."""
    want = case.baseline().float()
    err = float((case.fused().float() - want).norm() / want.norm())
    row = dict(base_us=time_us(case.baseline), ours_us=time_us(case.fused), err=err, graph_us=None,
               graph_err=None, graph_eager=False, graph_reason="")
    anchor = case.anchor(stream)
    row["graph_reason"] = anchor.reason
    if anchor.reason:
        return row
    try:
        case.anchor_out.fill_(float("nan"))
        stream.wait_stream(torch.cuda.current_stream())  # inputs and the poisoned output were written there
        with torch.cuda.stream(stream):
            anchor.run()
        stream.synchronize()
        row["graph_err"] = float((case.anchor_out.float() - want).norm() / want.norm())
    except Exception as exc:  # noqa: BLE001 - a graph that builds but fails to execute is reported, not fatal
        row["graph_reason"] = f"execute: {type(exc).__name__}: {exc}".splitlines()[0][:160]
        return row
    try:
        row["graph_us"] = time_us(anchor.run, stream)
    except Exception:  # noqa: BLE001 - not capturable into a CUDA graph: time it eagerly, marked "ev"
        torch.cuda.synchronize()
        row["graph_us"], row["graph_eager"] = time_us_eager(anchor.run, stream), True
    return row


def reference_lines(rows: list[dict]) -> list[str]:
    """Two targets of issue 12 from the table's rows: FP8 3x3 layers with e4m3 X against the fused FP16 graph, and
    depthwise layers against cuDNN's depthwise conv + activation."""
    lines = ["\n## FP8 3x3 layers (e4m3 X, as an FP8 producer writes it) vs the cuDNN fused FP16 graph\n",
             "fp8 = our FP8 FusedConv, plan default, X e4m3 with a per-tensor scale, W e4m3 per channel, fp16 output; "
             "err = |fp8 - base| / |base| (the e4m3 quantization). µs per call.\n",
             "| net | layer | batch | graph µs | fused fp16 µs | fp8 µs | fp8 vs graph | fp8 vs fused fp16 | err |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["fp8_err"] is None:
            continue
        fp8 = "wrong" if r["fp8_us"] is None else f"{r['fp8_us']:.1f}"
        ratio = lambda ref: "n/a" if ref is None or r["fp8_us"] is None else f"{ref / r['fp8_us']:.2f}x"  # noqa: E731
        graph = "n/a" if r["graph_us"] is None else f"{r['graph_us']:.1f}"
        lines.append(f"| {r['net']} | {r['layer']} | {r['batch']} | {graph} | {r['ours_us']:.1f} | {fp8} | "
                     f"{ratio(r['graph_us'])} | {ratio(r['ours_us'])} | {r['fp8_err']:.1e} |")
    lines += ["\n## Depthwise layers vs cuDNN depthwise + activation\n",
              "cudnn = torch's cuDNN depthwise conv2d with BatchNorm folded into W and bias, then the activation in "
              "place (two kernels); fused = our depthwise FusedConv. µs per call.\n",
              "| net | layer | batch | cudnn µs | graph µs | fused µs | vs cudnn |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["dw_cudnn_us"] is None:
            continue
        graph = "n/a" if r["graph_us"] is None else f"{r['graph_us']:.1f}"
        lines.append(f"| {r['net']} | {r['layer']} | {r['batch']} | {r['dw_cudnn_us']:.1f} | {graph} | "
                     f"{r['ours_us']:.1f} | {r['dw_cudnn_us'] / r['ours_us']:.2f}x |")
    return lines


def engine_us(row: dict, lay: Layer, n: int, arch: str) -> float:
    """The layer's time in an engine built with item 4's choice (plugins/conv/tensorrt_choice, its committed table: an
    earlier run's evidence, so this run's noise does not pick the faster side per layer): TensorRT's stand-in (the
    fastest of TENSORRT_STAND_INS, as the table takes it) where the choice leaves the conv to TensorRT, else ours."""
    shape = ConvShape(kernel=(lay.kernel,) * 2, stride=(lay.stride,) * 2, channels=lay.c, filters=lay.k,
                      groups=lay.groups, spatial=(lay.hw,) * 2, batch=n, residual=lay.residual)
    choice = choose(shape, arch)
    if choice is None or not choice.to_tensorrt:
        return row["ours_us"]
    return min(row[key] for key, _ in TENSORRT_STAND_INS if row.get(key) is not None)


def stack_lines(sums: dict) -> list[str]:
    """The whole-stack table: each network and batch summed over layers x count. "fused" runs every layer on
    FusedConv, layers item 4 leaves to TensorRT included; "engine" takes item 4's choice per layer (engine_us)."""
    lines = ["\n## Whole conv stacks (sum over layers x count)\n",
             "fused: every layer on FusedConv (item 4's choice ignored); engine: each layer as item 4's committed table "
             "decides (TensorRT's stand-in time where it leaves the conv to TensorRT).\n",
             "| network | batch | base µs | graph µs | fused µs | prev µs | vs base | vs graph | engine µs | engine vs graph "
             "| slowest layer vs graph |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for (net, n), s in sums.items():
        missing = f" ({s['missing']} layers n/a, left out of both)" if s["missing"] else ""
        vs_graph = f"{s['graph'] / s['ours_with_graph']:.2f}x{missing}" if s["graph"] else "n/a"
        engine = f"{s['graph'] / s['engine']:.2f}x" if s["engine"] else "n/a"
        worst = f"{s['worst'][1]} ({s['worst'][0]:.2f}x)" if s["worst"][1] else "n/a"
        lines.append(f"| {net} | {n} | {s['base']:.0f} | {s['graph']:.0f} | {s['ours']:.0f} | {s['prev']:.0f} | "
                     f"{s['base'] / s['ours']:.2f}x | {vs_graph} | {s['engine']:.0f} | {engine} | {worst} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="markdown file for the tables")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--sweep", help="batches to run the tile sweep at (e.g. 32), after the tables")
    parser.add_argument("--sweep-variants", choices=sorted(SWEEPS), default="mma.sync",
                        help="which sweep: mma.sync tiles, or the wgmma tiles / cluster / taps-inner variants")
    parser.add_argument("--sweep-only", action="store_true", help="only the sweep (no per-layer tables)")
    parser.add_argument("--sweep-layers", help="';'-separated layer names the sweep and the FP8 table are limited to "
                        "(e.g. '3x3 512>512 @7;1x1 2048>512 @7')")
    parser.add_argument("--fp8", action="store_true", help="add the FP8 table (ResNet-50 3x3 layers, sm_89+)")
    parser.add_argument("--fp8-only", action="store_true", help="only the FP8 table")
    parser.add_argument("--fp8-batches", default="8,32", help="batches of the FP8 table")
    parser.add_argument("--fp8-variants", help="regex: only the FP8 variants whose label matches (e.g. '^x8')")
    parser.add_argument("--fp8-chain-only", action="store_true",
                        help="only the FP8 chain table (benchmarks/conv_fp8_chain.py), at the --fp8-batches")
    parser.add_argument("--nets", default="ResNet-50,MobileNetV2", help="networks of the tables and sweep")
    parser.add_argument("--quick", action="store_true",
                        help=f"one run in under 4 minutes: batches {QUICK_BATCHES} per network, 150 s table budget")
    parser.add_argument("--budget-s", type=float, help="stop starting table rows after this many seconds "
                        "(the rows left are listed as not run); --quick sets 150")
    parser.add_argument("--json", help="also write the table rows as JSON (input of plugins/conv/tensorrt_choice)")
    parser.add_argument("--prev-kernels", type=Path, help="folder with an earlier tree's plugins/conv kernel sources: "
                        "the prev column runs them (same plans), to time a kernel change in the same run")
    args = parser.parse_args()
    global PREVIOUS_KERNELS
    PREVIOUS_KERNELS = args.prev_kernels.resolve() if args.prev_kernels else None
    torch.backends.cudnn.benchmark = True
    batches = [int(b) for b in args.batches.split(",")]
    if args.quick and args.budget_s is None:
        args.budget_s = 150.0
    batches_of = {net: (QUICK_BATCHES[net] if args.quick else batches) for net in ("ResNet-50", "MobileNetV2")}
    arch = device_arch(0)
    nets = {name: layers for name, layers in (("ResNet-50", resnet50()), ("MobileNetV2", mobilenet_v2()))
            if name in args.nets.split(",")}
    only = args.sweep_layers.split(";") if args.sweep_layers else None
    resnet_3x3 = [lay for lay, _ in resnet50() if lay.kernel == 3 and (not only or lay.name in only)]
    fp8_batches = [int(b) for b in args.fp8_batches.split(",")]
    if args.fp8_chain_only:
        from conv_fp8_chain import chain_table
        lines = ["# FP8 chains: a FusedConv writing e4m3 for the FP8 layer it feeds\n", f"{environment()}\n"]
        lines += chain_table(fp8_batches, arch)
        _write(args.out, lines)
        return
    if args.fp8_only:
        lines = ["# FP8 FusedConv vs cuDNN FP16 + separate epilogue ops\n", f"{environment()}\n"]
        lines += fp8_table(resnet_3x3, fp8_batches, arch, args.fp8_variants)
        _write(args.out, lines)
        return
    if args.sweep_only:
        lines = ["# FusedConv sweep\n", f"{environment()}\n"]
        lines += sweep(nets, [int(b) for b in args.sweep.split(",")], arch, SWEEPS[args.sweep_variants], only)
        _write(args.out, lines)
        return
    plans = {(p.source, tuple(sorted(p.defines.items()))): p for net, layers in nets.items() for lay, _ in layers
             for n in batches_of[net] for p in [layer_plan(lay, n, arch)]
             + [q for q in [previous_plan(lay, n, arch)] if q is not None]
             + ([layer_plan(lay, n, arch, FP8_SCALE_X, x_e4m3=True)] if takes_fp8_x8(lay, arch) else [])}
    precompile(plans.values(), arch, workers=16)  # nvcc and the driver's JIT, in parallel, before timing

    env = environment()
    lines = [f"# FusedConv vs the cuDNN fused graph and cuDNN + separate epilogue ops\n", f"{env}\n",
             "Per call, µs (CUDA-graph replay median; \"ev\": cudaEvent median over back-to-back calls where the "
             "cuDNN graph could not be captured). graph = one cuDNN frontend graph conv_fprop -> bias -> [add "
             "residual] -> activation, runtime fusion (heur_mode A, then FALLBACK), as TensorRT runs the layer; base = "
             "cuDNN conv2d + BatchNorm + activation [+ add + ReLU] as the unfused model runs them; fused = one FusedConv "
             "kernel (main loop: ws = the warp-specialized Hopper kernel, wgmma, mma.sync, dw = depthwise; BLOCK_MxN, "
             "cN = the reduction split over an N-CTA cluster, sw = M-tile pairs sharing the W tile, Nst = the ring's "
             "stages of the unspecialized wgmma loop, trN = the stem's tap-row gather for N blocks per SM); prev = the "
             f"previous session's rule (benchmarks/conv.py PREVIOUS_RULE: {PREVIOUS_RULE_TEXT})"
             + (f" on the kernel sources of {PREVIOUS_KERNELS} (an earlier tree)" if PREVIOUS_KERNELS else "")
             + " (\"=\": the same kernel). err = |fused - base| / |base|, graph err = |graph - base| / |base| "
             "(normwise).\n"]
    if args.quick:
        lines.append(f"Quick run: batches {QUICK_BATCHES}.\n")
    def checkpoint(rows):
        _write(args.out, lines)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(environment=env, arch=arch, rows=rows), f, indent=1)

    rows, reasons, sums = table_rows(nets, batches_of, arch, args.budget_s, lines, checkpoint)
    tables = stack_lines(sums) + reference_lines(rows)
    lines += tables
    if reasons:
        lines += ["\nGraphs that did not build or run (n/a):\n"] + [f"- {r}: {', '.join(where)}"
                                                                  for r, where in reasons.items()]
    summary = "\n".join(tables + [f"n/a ({len(where)}): {r}" for r, where in reasons.items()])
    if args.fp8:
        lines += fp8_table(resnet_3x3, fp8_batches, arch, args.fp8_variants)
    checkpoint(rows)
    print(summary, flush=True)
    if args.sweep:  # after the tables are safe on disk
        lines += sweep(nets, [int(b) for b in args.sweep.split(",")], arch, SWEEPS[args.sweep_variants], only)
        _write(args.out, lines)
        print(summary)


def _write(path: str | None, lines: list[str]) -> None:
    if path:
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
