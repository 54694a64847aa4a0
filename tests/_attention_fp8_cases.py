"""FP8 (E4M3) FusedAttention cases the GPU test runs and the compile test builds (one list, so CI compiles what the
GPU test launches): shapes, attributes and the compile-time FP8 scales of each case; inputs are drawn per run."""
from __future__ import annotations

from dataclasses import dataclass, replace

from _attention_cases import AttentionCase
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION, mask_dtype_name
from trt_fusedattn.plugins.attention.plan import plan_attention

E4M3 = "float8_e4m3fn"


@dataclass(frozen=True)
class FP8Case(AttentionCase):
    dtype: str = E4M3
    output_dtype: str = "auto"       # auto (float16), float16, bfloat16 or float8e4m3fn
    data: str = "normal"             # "normal": N(0, 1); "heavy": heavy-tailed with outliers (FA3's test kind)
    p_scale: float = 0.0
    output_scale: float = 0.0

    def amax(self) -> float:
        """The calibrated range of Q/K/V this case's scales assume (values beyond it saturate)."""
        return 6.0 if self.data == "normal" else 40.0

    def attrs(self) -> dict:
        scale = self.amax() / 448.0
        return FUSED_ATTENTION.resolve({
            "layout": self.layout, "scale": self.scale, "softcap": self.softcap, "causal": self.causal,
            "causal_alignment": self.alignment, "q_scale": scale, "k_scale": scale, "v_scale": scale,
            "p_scale": self.p_scale, "output_dtype": self.output_dtype, "output_scale": self.output_scale})

    def mask_dtype(self) -> str | None:
        return None if self.mask is None else "bool" if self.mask == "bool" else mask_dtype_name(E4M3, self.attrs())

    def plan(self, arch: str):
        q_shape, k_shape, v_shape = self.shapes()
        return plan_attention(
            [q_shape, k_shape, v_shape, None if self.mask is None else self.full_mask_shape(),
             (self.batch,) if self.key_lengths else None],
            [E4M3] * 3 + [self.mask_dtype(), "int32" if self.key_lengths else None], self.attrs(), arch,
            tuning=dict(self.tuning) or None)


def _key_tile_cases(tag: str, tuning: tuple) -> list:
    """Head dim 128 on another key tile (``tuning``): an e4m3 output and bottom-right causal key lengths (small), top-left
    causal over more keys than queries, heavy-tailed GQA, a long key row."""
    e4m3_out = dict(output_dtype="float8e4m3fn", output_scale=2.0 / 448)
    return [
        FP8Case(f"fp8-{tag}-hd128-e4m3-out", dim=128, len_q=300, len_kv=700, **e4m3_out, tuning=tuning, small=True),
        FP8Case(f"fp8-{tag}-hd128-keylen-causal-br", dim=128, key_lengths=True, len_q=500, len_kv=1000, causal=1,
                alignment="bottom_right", tuning=tuning, small=True),
        FP8Case(f"fp8-{tag}-hd128-causal-top-left-100x300", dim=128, len_q=100, len_kv=300, causal=1, tuning=tuning),
        FP8Case(f"fp8-{tag}-hd128-heavy-gqa", dim=128, data="heavy", heads_q=8, heads_kv=2, len_q=500, len_kv=1500,
                tuning=tuning),
        FP8Case(f"fp8-{tag}-hd128-long-kv-7x16534", batch=1, heads_q=2, heads_kv=2, len_q=7, len_kv=16534, dim=128,
                tuning=tuning),
    ]


def _cases():
    e4m3_out = dict(output_dtype="float8e4m3fn", output_scale=2.0 / 448)
    cases = [FP8Case(f"fp8-hd{d}", dim=d, small=True) for d in (64, 128, 256)]
    cases += [FP8Case(f"fp8-hd{d}-bf16-out", dim=d, output_dtype="bfloat16") for d in (64, 128, 256)]
    cases += [FP8Case(f"fp8-hd{d}-e4m3-out", dim=d, len_q=300, len_kv=700, **e4m3_out, small=d == 128)
              for d in (64, 128, 256)]
    for lq, lkv, d in ((1, 1, 64), (7, 7, 128), (1, 300, 256), (127, 7, 64), (1000, 1000, 128), (200, 1000, 256),
                       (129, 257, 64)):
        cases.append(FP8Case(f"fp8-len{lq}x{lkv}-hd{d}", len_q=lq, len_kv=lkv, dim=d))
    for lq, lkv in ((127, 127), (100, 300), (300, 100), (1, 129)):
        for al in ("top_left", "bottom_right"):
            for d in (64, 128):
                cases.append(FP8Case(f"fp8-causal-{al}-{lq}x{lkv}-hd{d}", len_q=lq, len_kv=lkv, dim=d, causal=1,
                                     alignment=al, small=(lq, lkv, d) == (100, 300, 64)))
    cases += [
        FP8Case("fp8-causal-br-300x1000-hd256", len_q=300, len_kv=1000, dim=256, causal=1, alignment="bottom_right"),
        FP8Case("fp8-gqa-hd128", heads_q=8, heads_kv=2, dim=128, small=True),
        FP8Case("fp8-mqa-bhsd-hd64", heads_q=6, heads_kv=1, layout="BHSD"),
        FP8Case("fp8-cross-bhsd-hd256", len_q=77, len_kv=333, layout="BHSD", dim=256),
        FP8Case("fp8-peaky-scale-hd128", scale=0.6, dim=128, len_q=300, len_kv=1000),
        FP8Case("fp8-negative-scale-hd64", scale=-0.2),
        FP8Case("fp8-softcap-hd128", dim=128, scale=0.5, softcap=3.0, len_kv=300),
        FP8Case("fp8-p-scale-hd64", p_scale=4.0 / 448, len_kv=500),
        FP8Case("fp8-key-lengths-hd64", key_lengths=True, len_kv=300, small=True),
        FP8Case("fp8-key-lengths-causal-br-hd128", key_lengths=True, len_q=90, len_kv=300, causal=1,
                alignment="bottom_right", dim=128),
        # three query tiles; batch 0 has no keys, so none of its query tiles has a K/V tile
        FP8Case("fp8-key-lengths-causal-br-300x700-hd128", key_lengths=True, len_q=300, len_kv=700, causal=1,
                alignment="bottom_right", dim=128, small=True),
        FP8Case("fp8-additive-full-hd64", mask="additive", small=True),
        FP8Case("fp8-additive-bf16-out-hd128", mask="additive", dim=128, output_dtype="bfloat16"),
        FP8Case("fp8-additive-e4m3-out-hd256", mask="additive", mask_shape=(2, 1, 1, 127), dim=256, **e4m3_out),
        FP8Case("fp8-additive-2d-gqa-hd128", mask="additive", mask_shape=(127, 127), heads_q=8, heads_kv=2, dim=128),
        FP8Case("fp8-bool-full-hd128", mask="bool", dim=128, small=True),
        FP8Case("fp8-bool-3d-causal-hd64", mask="bool", mask_shape=(1, 127, 200), len_kv=200, causal=1),
        FP8Case("fp8-bool-keylen-bhsd-hd256", mask="bool", mask_shape=(2, 1, 1, 127), key_lengths=True,
                layout="BHSD", dim=256),
    ]
    cases += [FP8Case(f"fp8-heavy-hd{d}", dim=d, data="heavy", len_q=500, len_kv=1500) for d in (64, 128, 256)]
    cases.append(FP8Case("fp8-heavy-causal-e4m3-out-hd128", dim=128, data="heavy", len_q=1000, len_kv=1000, causal=1,
                         **e4m3_out))
    cases += [  # long rows: the K/V pipeline wraps its stages many times
        FP8Case("fp8-causal-16534-hd64", batch=1, heads_q=1, heads_kv=1, len_q=16534, len_kv=16534, causal=1),
        FP8Case("fp8-long-kv-7x16534-hd128", batch=1, heads_q=2, heads_kv=2, len_q=7, len_kv=16534, dim=128),
        FP8Case("fp8-long-q-16534x127-hd256", batch=1, heads_q=2, heads_kv=1, len_q=16534, len_kv=127, dim=256),
        FP8Case("fp8-causal-4100-hd256", batch=1, heads_q=2, heads_kv=2, len_q=4100, len_kv=4100, dim=256, causal=1),
    ]
    exp2_fma = (("EXP2_FMA_EVERY", 4),)  # a quarter of the exponentials on the FP32 pipe
    cases += [
        FP8Case("fp8-exp2fma-hd64-causal-br", len_q=300, len_kv=1000, causal=1, alignment="bottom_right",
                tuning=exp2_fma),
        FP8Case("fp8-exp2fma-hd128-heavy-keylen", dim=128, data="heavy", key_lengths=True, len_kv=700, tuning=exp2_fma),
        FP8Case("fp8-exp2fma-hd256-additive-e4m3-out", dim=256, mask="additive", output_dtype="float8e4m3fn",
                output_scale=2.0 / 448, tuning=exp2_fma, small=True),
    ]
    wg3 = (("BLOCK_M", 192), ("NUM_WARPS", 12))  # three MMA warpgroups (192-row tiles; hd128 on 64-key tiles)
    cases += [
        FP8Case("fp8-3wg-hd64-500x700", len_q=500, len_kv=700, tuning=wg3, small=True),
        FP8Case("fp8-3wg-hd64-causal-br-gqa", heads_q=8, heads_kv=2, len_q=300, len_kv=1000, causal=1,
                alignment="bottom_right", tuning=wg3),
        FP8Case("fp8-3wg-hd128-e4m3-out", dim=128, len_q=300, len_kv=700, **e4m3_out, tuning=wg3 + (("BLOCK_N", 64),),
                small=True),
        FP8Case("fp8-3wg-hd128-keylen-causal", dim=128, key_lengths=True, len_q=1000, len_kv=1000, causal=1,
                tuning=wg3 + (("BLOCK_N", 64),)),
        FP8Case("fp8-3wg-hd128-long-kv-7x16534", batch=1, heads_q=2, heads_kv=2, len_q=7, len_kv=16534, dim=128,
                tuning=wg3 + (("BLOCK_N", 64),)),
        FP8Case("fp8-3wg-hd128-heavy-additive", dim=128, data="heavy", mask="additive", len_q=500, len_kv=500,
                tuning=wg3 + (("BLOCK_N", 64),)),
    ]
    # head dim 128 on 192-key tiles (V^T in three 64-byte-swizzled column blocks); masks spill there (bool: 96 B)
    n192 = (("BLOCK_M", 128), ("NUM_WARPS", 8), ("BLOCK_N", 192), ("KV_LOAD_LAG", 1))
    cases += _key_tile_cases("n192", n192)
    cases.append(FP8Case("fp8-n192-hd128-2stages", dim=128, len_q=700, len_kv=1100, tuning=n192 + (("KV_STAGES", 2),)))
    # head dim 128 on three MMA warpgroups with 96-key tiles (V^T in three 32-byte-swizzled column blocks)
    wg3_n96 = (("BLOCK_M", 192), ("NUM_WARPS", 12), ("BLOCK_N", 96), ("PV_OVERLAP", 1))  # (v9's default)
    cases += [
        FP8Case("fp8-3wg-n96-hd128-e4m3-out", dim=128, len_q=300, len_kv=700, **e4m3_out, tuning=wg3_n96, small=True),
        FP8Case("fp8-3wg-n96-hd128-keylen-causal-br", dim=128, key_lengths=True, len_q=500, len_kv=1000, causal=1,
                alignment="bottom_right", tuning=wg3_n96, small=True),
        FP8Case("fp8-3wg-n96-hd128-heavy-gqa", dim=128, data="heavy", heads_q=8, heads_kv=2, len_q=500, len_kv=1500,
                tuning=wg3_n96),
        FP8Case("fp8-3wg-n96-hd128-long-kv-7x16534", batch=1, heads_q=2, heads_kv=2, len_q=7, len_kv=16534, dim=128,
                tuning=wg3_n96),
        FP8Case("fp8-3wg-n96-hd128-causal-4100-lag2", batch=1, heads_q=2, heads_kv=2, len_q=4100, len_kv=4100,
                dim=128, causal=1, tuning=wg3_n96 + (("KV_LOAD_LAG", 2), ("KV_STAGES", 3))),
    ]
    # PV_OVERLAP=0 (attention_mma_warpgroups_sm90.cuh's serial step: S and P never live together): head dim 128 on
    # three warpgroups x 128-key tiles (MMA 160 registers, loader 32) with P V(t+1) in the turn before Q K^T(t); the
    # default tiles of each head dim; head dim 256 on 128x128 tiles (S 64 + O 128 registers, two stages and one V
    # staging tile: 230,384 B of shared memory)
    wg3_n128_serial = (("BLOCK_M", 192), ("NUM_WARPS", 12), ("BLOCK_N", 128), ("PV_OVERLAP", 0))
    serial = (("PV_OVERLAP", 0),)
    cases += [
        FP8Case("fp8-pvserial-n128-hd128-e4m3-out", dim=128, len_q=300, len_kv=700, **e4m3_out,
                tuning=wg3_n128_serial, small=True),
        FP8Case("fp8-pvserial-n128-hd128-keylen-causal-br", dim=128, key_lengths=True, len_q=500, len_kv=1000,
                causal=1, alignment="bottom_right", tuning=wg3_n128_serial, small=True),
        FP8Case("fp8-pvserial-n128-hd128-heavy-gqa", dim=128, data="heavy", heads_q=8, heads_kv=2, len_q=500,
                len_kv=1500, tuning=wg3_n128_serial),
        FP8Case("fp8-pvserial-n128-hd128-long-kv-7x16534", batch=1, heads_q=2, heads_kv=2, len_q=7, len_kv=16534,
                dim=128, tuning=wg3_n128_serial),
        FP8Case("fp8-pvserial-n128-hd128-causal-4100", batch=1, heads_q=2, heads_kv=2, len_q=4100, len_kv=4100,
                dim=128, causal=1, tuning=wg3_n128_serial),
        FP8Case("fp8-pvserial-n128-hd128-1x1", len_q=1, len_kv=1, dim=128, tuning=wg3_n128_serial),
        FP8Case("fp8-pvserial-n96-hd128-bf16-out", dim=128, len_q=700, len_kv=1100, output_dtype="bfloat16",
                tuning=serial),
        FP8Case("fp8-pvserial-n64-hd256-e4m3-out", dim=256, len_q=300, len_kv=1000, **e4m3_out,
                tuning=serial + (("BLOCK_N", 64),), small=True),
        FP8Case("fp8-pvserial-n64-hd256-causal-br-300x1000", dim=256, len_q=300, len_kv=1000, causal=1,
                alignment="bottom_right", tuning=serial + (("BLOCK_N", 64),)),
        FP8Case("fp8-pvserial-n128-hd256-e4m3-out", dim=256, len_q=300, len_kv=1000, **e4m3_out,
                tuning=serial + (("BLOCK_N", 128),), small=True),
        FP8Case("fp8-pvserial-n128-hd256-keylen-causal-br", dim=256, key_lengths=True, len_q=500, len_kv=1000,
                causal=1, alignment="bottom_right", tuning=serial + (("BLOCK_N", 128),)),
        FP8Case("fp8-pvserial-n128-hd256-heavy-causal-1100", dim=256, data="heavy", len_q=1100, len_kv=1100,
                causal=1, tuning=serial + (("BLOCK_N", 128),), small=True),
        FP8Case("fp8-overlap-n64-hd256-keylen", dim=256, key_lengths=True, len_q=300, len_kv=1000,
                tuning=(("BLOCK_N", 64), ("PV_OVERLAP", 1)), small=True),  # (v9's default)
        FP8Case("fp8-pvserial-hd64-gqa-causal-500x700", dim=64, heads_q=8, heads_kv=2, len_q=500, len_kv=700,
                causal=1, tuning=serial, small=True),
    ]
    # V_TRANSPOSE_BATCH=4: four transpose units in flight a loader warp (loader 56 registers, MMA 224)
    vtb4 = (("V_TRANSPOSE_BATCH", 4),)
    cases += [
        FP8Case("fp8-vtb4-hd256-e4m3-out", dim=256, len_q=300, len_kv=1000, **e4m3_out, tuning=vtb4, small=True),
        FP8Case("fp8-vtb4-hd256-keylen-causal-br", dim=256, key_lengths=True, len_q=500, len_kv=1000, causal=1,
                alignment="bottom_right", tuning=vtb4, small=True),
        FP8Case("fp8-vtb4-hd256-long-kv-7x16534", batch=1, heads_q=2, heads_kv=2, len_q=7, len_kv=16534, dim=256,
                tuning=vtb4),
        FP8Case("fp8-vtb4-hd256-additive-heavy", dim=256, data="heavy", mask="additive", len_q=200, len_kv=500,
                tuning=vtb4 + (("VT_ADDRESS_STEP", 0), ("KV_WHOLE_TILE_COPIES", 0))),  # (masked: 64-key tiles; with
        # the hd256 default's stepped transpose and whole-tile copies four units in flight spill 4 B there)
    ]
    # SERIAL_PV_IN_TURN=2 (P V(t+1) and Q K^T(t) in the turn without a drain between them: P live beside S) on hd128's
    # three warpgroups x 96 keys (S 48 + P 12 + O 64 registers fit 152)
    nodrain = (("BLOCK_N", 96), ("SERIAL_PV_IN_TURN", 2))
    cases += [
        FP8Case("fp8-3wg-n96-nodrain-hd128-e4m3-out", dim=128, len_q=300, len_kv=700, **e4m3_out, tuning=nodrain,
                small=True),
        FP8Case("fp8-3wg-n96-nodrain-hd128-causal-4100", batch=1, heads_q=2, heads_kv=2, len_q=4100, len_kv=4100,
                dim=128, causal=1, tuning=nodrain),
    ]
    # the loader publishing tile i while tiles i + 1, i + 2 (lag 2) are in flight: three V staging tiles
    lag2 = (("KV_LOAD_LAG", 2),)
    cases += [  # (causal hd128: on 128x128 tiles, three stages; its default tile has two)
        FP8Case("fp8-lag2-hd128-keylen-causal-br", dim=128, key_lengths=True, len_q=300, len_kv=700, causal=1,
                alignment="bottom_right", tuning=lag2 + (("BLOCK_N", 128), ("KV_STAGES", 3)), small=True),
        FP8Case("fp8-lag2-hd64-gqa-500x700", heads_q=8, heads_kv=2, len_q=500, len_kv=700, tuning=lag2, small=True),
        FP8Case("fp8-lag2-n64-hd256-3stages-e4m3-out", dim=256, len_q=300, len_kv=1000, **e4m3_out,
                tuning=lag2 + (("KV_STAGES", 3), ("BLOCK_N", 64)), small=True),
        FP8Case("fp8-lag2-hd128-long-kv-7x16534", batch=1, heads_q=2, heads_kv=2, len_q=7, len_kv=16534, dim=128,
                tuning=lag2),
        FP8Case("fp8-lag2-hd128-1x1", len_q=1, len_kv=1, dim=128, tuning=lag2),  # fewer tiles than the lag
        FP8Case("fp8-lag2-hd256-3stages-additive-heavy", dim=256, data="heavy", mask="additive", len_q=200, len_kv=500,
                tuning=lag2 + (("KV_STAGES", 3),)),  # (masked: 64-key tiles, FP8_TILES_MASKED)
    ]
    # VT_ADDRESS_STEP=1: the V transpose's addresses stepped from one base a column strip (hd64: a warp's key groups
    # start at 4; hd256: two strips a warp; 192- and 96-key tiles: 64- and 32-byte V^T rows in column blocks)
    step = (("VT_ADDRESS_STEP", 1),)
    cases += [
        FP8Case("fp8-vtstep-hd64-gqa-500x700", heads_q=8, heads_kv=2, len_q=500, len_kv=700, tuning=step, small=True),
        FP8Case("fp8-vtstep-hd128-e4m3-out", dim=128, len_q=300, len_kv=700, **e4m3_out, tuning=step, small=True),
        FP8Case("fp8-vtstep-hd256-keylen-causal-br", dim=256, key_lengths=True, len_q=500, len_kv=1000, causal=1,
                alignment="bottom_right", tuning=step, small=True),
        FP8Case("fp8-vtstep-hd256-additive-heavy", dim=256, data="heavy", mask="additive", len_q=200, len_kv=500,
                tuning=step),  # (masked: 64-key tiles, two strips of four key groups a warp)
        FP8Case("fp8-vtstep-n192-hd128-causal-top-left-100x300", dim=128, len_q=100, len_kv=300, causal=1,
                tuning=n192 + step),
        FP8Case("fp8-vtstep-3wg-n96-hd128-heavy-gqa", dim=128, data="heavy", heads_q=8, heads_kv=2, len_q=500,
                len_kv=1500, tuning=wg3_n96 + step),
        FP8Case("fp8-vtstep-3wg-n64-hd128-keylen-causal", dim=128, key_lengths=True, len_q=1000, len_kv=1000,
                causal=1, tuning=wg3 + (("BLOCK_N", 64),) + step),
    ]
    # KV_WHOLE_TILE_COPIES=1: whole K/V tiles copied without bounds tests (a partial last tile beside them), alone and
    # with VT_ADDRESS_STEP
    whole = (("KV_WHOLE_TILE_COPIES", 1),)
    cases += [
        FP8Case("fp8-whole-hd128-keylen-causal-br", dim=128, key_lengths=True, len_q=500, len_kv=1000, causal=1,
                alignment="bottom_right", tuning=whole, small=True),
        FP8Case("fp8-whole-hd64-bhsd-1000x1100", len_q=1000, len_kv=1100, layout="BHSD", tuning=whole, small=True),
        FP8Case("fp8-whole-hd256-long-kv-7x16534", batch=1, heads_q=2, heads_kv=2, len_q=7, len_kv=16534, dim=256,
                tuning=whole),
        FP8Case("fp8-whole-vtstep-hd256-heavy-causal-1100", dim=256, data="heavy", len_q=1100, len_kv=1100, causal=1,
                tuning=whole + step, small=True),
        FP8Case("fp8-whole-vtstep-hd128-causal-4100", batch=1, heads_q=2, heads_kv=2, len_q=4100, len_kv=4100,
                dim=128, causal=1, tuning=whole + step),
        FP8Case("fp8-whole-vtstep-hd64-causal-16534", batch=1, heads_q=1, heads_kv=1, len_q=16534, len_kv=16534,
                causal=1, tuning=whole + step),
    ]
    # head dim 128 on two MMA warpgroups x 256-key tiles (cuDNN's FP8 hd128 shape) with the serial step: S 128 + O 64
    # registers, P packed over S; two stages (208 KB); alone, with the trimmed loader (stepped transpose addresses,
    # whole-tile copies) and with four transpose units in flight (loader 56 registers)
    n256 = (("BLOCK_M", 128), ("NUM_WARPS", 8), ("BLOCK_N", 256), ("KV_STAGES", 2), ("KV_LOAD_LAG", 1),
            ("PV_OVERLAP", 0))
    n256_trim = n256 + step + whole
    cases += _key_tile_cases("n256", n256)
    cases += [
        FP8Case("fp8-n256-hd128-causal-4100", batch=1, heads_q=2, heads_kv=2, len_q=4100, len_kv=4100, dim=128,
                causal=1, tuning=n256),
        FP8Case("fp8-n256-hd128-1x1", len_q=1, len_kv=1, dim=128, tuning=n256),
        FP8Case("fp8-n256-trim-hd128-heavy-causal-1100", dim=128, data="heavy", len_q=1100, len_kv=1100, causal=1,
                tuning=n256_trim, small=True),
        FP8Case("fp8-n256-trim-hd128-bhsd-1000x1100", dim=128, len_q=1000, len_kv=1100, layout="BHSD",
                tuning=n256_trim),
        FP8Case("fp8-n256-vtb4-hd128-keylen-causal-br", dim=128, key_lengths=True, len_q=500, len_kv=1000, causal=1,
                alignment="bottom_right", tuning=n256_trim + (("V_TRANSPOSE_BATCH", 4),), small=True),
        FP8Case("fp8-n256-vtb4-hd128-long-kv-7x16534", batch=1, heads_q=2, heads_kv=2, len_q=7, len_kv=16534,
                dim=128, tuning=n256_trim + (("V_TRANSPOSE_BATCH", 4),)),
    ]
    two_stages = (("KV_STAGES", 2), ("KV_LOAD_LAG", 1))  # the benchmark's alternatives (lag < stages)
    cases += [replace(c, name=c.name + "-2stages", tuning=two_stages, small=False)
              for c in cases if c.name in ("fp8-hd64", "fp8-hd128", "fp8-causal-bottom_right-100x300-hd128")]
    return cases


FP8_CASES = _cases()
