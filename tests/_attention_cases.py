"""FusedAttention cases the GPU tests run and the compile test builds: one place, so CI compiles exactly what the
GPU tests launch. A case is shapes + dtypes + attributes; inputs are drawn fresh per run."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.plan import plan_attention


@dataclass(frozen=True)
class AttentionCase:
    name: str
    batch: int = 2
    heads_q: int = 4
    heads_kv: int = 4
    len_q: int = 127
    len_kv: int = 127
    dim: int = 64
    dim_v: int | None = None         # V's head dim when it differs from Q/K's
    dtype: str = "bfloat16"
    layout: str = "BSHD"
    causal: int = 0
    alignment: str = "top_left"
    scale: float = 0.0
    softcap: float = 0.0
    mask: str | None = None          # None, "additive" or "bool"
    mask_shape: tuple | None = None  # broadcastable to [B, Hq, Lq, Lkv]; default full
    key_lengths: bool = False
    small: bool = field(default=False)  # also run under compute-sanitizer
    tuning: tuple = ()                   # plan tuning overrides as (name, value) pairs, e.g. (("WGMMA", 1),)

    def shapes(self):
        """Q, K and V shapes in the case's layout."""
        def shape(length, heads, dim):
            return (self.batch, length, heads, dim) if self.layout == "BSHD" else (self.batch, heads, length, dim)
        return (shape(self.len_q, self.heads_q, self.dim), shape(self.len_kv, self.heads_kv, self.dim),
                shape(self.len_kv, self.heads_kv, self.dim_v or self.dim))

    def out_shape(self):
        return (*self.shapes()[0][:-1], self.dim_v or self.dim)

    def full_mask_shape(self):
        return self.mask_shape or (self.batch, self.heads_q, self.len_q, self.len_kv)

    def attrs(self) -> dict:
        return FUSED_ATTENTION.resolve({"layout": self.layout, "scale": self.scale, "softcap": self.softcap,
                                        "causal": self.causal, "causal_alignment": self.alignment})

    def plan(self, arch: str):
        q_shape, k_shape, v_shape = self.shapes()
        mask_dtype = None if self.mask is None else ("bool" if self.mask == "bool" else self.dtype)
        return plan_attention(
            [q_shape, k_shape, v_shape, None if self.mask is None else self.full_mask_shape(),
             (self.batch,) if self.key_lengths else None],
            [self.dtype] * 3 + [mask_dtype, "int32" if self.key_lengths else None], self.attrs(), arch,
            tuning=dict(self.tuning) or None)


def _cases():
    cases = [AttentionCase(f"hd{d}-{t}", dim=d, dtype=t, small=True)
             for d in (16, 32, 64, 96, 128, 256) for t in ("float16", "bfloat16")]
    for lq, lkv in ((1, 1), (7, 7), (1, 300), (7, 127), (127, 7), (200, 1000), (1000, 64)):
        cases.append(AttentionCase(f"len{lq}x{lkv}", len_q=lq, len_kv=lkv, dtype="float16"))
    for lq, lkv in ((127, 127), (100, 300), (300, 100), (1, 129)):
        for al in ("top_left", "bottom_right"):
            for d in (64, 128):
                cases.append(AttentionCase(f"causal-{al}-{lq}x{lkv}-hd{d}", len_q=lq, len_kv=lkv, dim=d, causal=1,
                                           alignment=al, small=(lq, lkv) == (100, 300)))
    cases += [
        AttentionCase("long-kv-16534", batch=1, heads_q=2, heads_kv=2, len_q=7, len_kv=16534),
        AttentionCase("long-q-16534", batch=1, heads_q=2, heads_kv=1, len_q=16534, len_kv=127, dim=128),
        AttentionCase("causal-16534", batch=1, heads_q=1, heads_kv=1, len_q=16534, len_kv=16534, causal=1),
        AttentionCase("gqa", heads_q=8, heads_kv=2, small=True),
        AttentionCase("mqa-bhsd", heads_q=6, heads_kv=1, layout="BHSD", dtype="float16", dim=128),
        AttentionCase("cross-bhsd", len_q=77, len_kv=333, layout="BHSD", small=True),
        AttentionCase("scale", scale=0.37, dtype="float16"),
        AttentionCase("negative-scale", scale=-0.2, dtype="float16"),
        AttentionCase("key-lengths", key_lengths=True, len_kv=300, small=True),
        AttentionCase("key-lengths-causal-br", key_lengths=True, len_q=90, len_kv=300, causal=1,
                      alignment="bottom_right", dim=128, dtype="float16"),
        AttentionCase("additive-full", mask="additive", small=True),
        AttentionCase("additive-2d", mask="additive", mask_shape=(127, 127), dtype="float16"),
        AttentionCase("additive-b11k", mask="additive", mask_shape=(2, 1, 1, 127), dim=128),
        AttentionCase("additive-1hqk-gqa", mask="additive", mask_shape=(1, 8, 127, 127), heads_q=8, heads_kv=2),
        AttentionCase("bool-full", mask="bool", small=True, dtype="float16"),
        AttentionCase("bool-3d-causal", mask="bool", mask_shape=(1, 127, 200), len_kv=200, causal=1, dim=128),
        AttentionCase("bool-keylen-bhsd", mask="bool", mask_shape=(2, 1, 1, 127), key_lengths=True, layout="BHSD"),
        AttentionCase("additive-hd256-causal", mask="additive", dim=256, causal=1, dtype="float16"),
        AttentionCase("bool-hd32-cross", mask="bool", dim=32, len_q=50, len_kv=260),
        AttentionCase("additive-hd16-causal-br", mask="additive", mask_shape=(2, 1, 1, 90), dim=16, len_q=40,
                      len_kv=90, causal=1, alignment="bottom_right", dtype="float16"),
    ]
    # issue 14: head dims padded inside the kernel (Stable Diffusion's 40/80/160, MobileViT-like 20/30, odd ones),
    # D_qk != D_v (LeViT 16/64, MLA 192/128), head dim 512 (SD's VAE; the portable path, correct not fast), softcap
    for d in (40, 80, 160):
        for t in ("float16", "bfloat16"):
            cases.append(AttentionCase(f"pad-hd{d}-{t}", dim=d, dtype=t, small=d == 40))
    cases += [
        AttentionCase("pad-hd40-causal-keylen", dim=40, len_q=300, len_kv=300, causal=1, key_lengths=True),
        AttentionCase("pad-hd80-additive-bhsd", dim=80, mask="additive", layout="BHSD", dtype="float16"),
        AttentionCase("pad-hd160-gqa-cross", dim=160, heads_q=8, heads_kv=2, len_q=77, len_kv=1000),
        AttentionCase("pad-hd20", dim=20, dtype="float16", small=True),
        AttentionCase("pad-hd30-bhsd-causal", dim=30, layout="BHSD", causal=1, len_q=200, len_kv=200),
        AttentionCase("pad-hd33-dv20", dim=33, dim_v=20, dtype="float16", small=True),
        AttentionCase("dv-16-64", dim=16, dim_v=64, dtype="float16", small=True),
        AttentionCase("dv-16-32-bool", dim=16, dim_v=32, mask="bool", len_kv=300),
        AttentionCase("dv-192-128-causal-br", dim=192, dim_v=128, len_q=100, len_kv=300, causal=1,
                      alignment="bottom_right"),
        AttentionCase("dv-64-128-gqa", dim=64, dim_v=128, heads_q=8, heads_kv=2, dtype="float16"),
        AttentionCase("dv-128-64-bhsd", dim=128, dim_v=64, layout="BHSD"),
        AttentionCase("hd512-float16", batch=1, heads_q=2, heads_kv=2, len_q=100, len_kv=300, dim=512,
                      dtype="float16", small=True),
        AttentionCase("hd512-causal-bf16", batch=1, heads_q=2, heads_kv=1, len_q=300, len_kv=300, dim=512, causal=1),
        AttentionCase("softcap-hd64", scale=0.9, softcap=5.0, dtype="float16", small=True),
        AttentionCase("softcap-hd64-additive-causal", scale=0.9, softcap=5.0, mask="additive", causal=1),
        AttentionCase("softcap-hd128", dim=128, softcap=2.0, len_q=300, len_kv=700, dtype="float16"),
        AttentionCase("softcap-hd128-bool", dim=128, softcap=2.0, mask="bool", len_kv=300),
        AttentionCase("softcap-hd40-negative-scale", dim=40, scale=-0.3, softcap=3.0, dtype="float16"),
    ]
    return cases


CASES = _cases()


def _wgmma_cases():
    """The Hopper wgmma mainloop (tuning WGMMA=1, sm_90a, head dims 64/128) over every feature: dtypes, odd and long
    lengths, causal in both alignments, masks, key lengths, GQA/MQA, both layouts, scales, and the other tiles the
    benchmark times (head dim 64 with 128-key tiles, one block per SM; head dim 128 with 64-key tiles)."""
    wg = (("WGMMA", 1),)
    bn128 = wg + (("BLOCK_N", 128), ("MIN_BLOCKS_PER_SM", 1))
    bn64 = wg + (("BLOCK_N", 64),)
    bn64_2 = bn64 + (("MIN_BLOCKS_PER_SM", 2),)
    ov = wg + (("WGMMA_OVERLAP", 1),)
    cases = [AttentionCase(f"wg-hd{d}-{t}", dim=d, dtype=t, tuning=wg) for d in (64, 128) for t in ("float16", "bfloat16")]
    for lq, lkv, d in ((1, 1, 64), (7, 7, 128), (1, 300, 64), (127, 7, 128), (1000, 1000, 64), (200, 1000, 128)):
        cases.append(AttentionCase(f"wg-len{lq}x{lkv}-hd{d}", len_q=lq, len_kv=lkv, dim=d, dtype="float16", tuning=wg))
    for lq, lkv in ((127, 127), (100, 300), (300, 100), (1, 129)):
        for al in ("top_left", "bottom_right"):
            for d, t in ((64, "bfloat16"), (128, "float16")):
                cases.append(AttentionCase(f"wg-causal-{al}-{lq}x{lkv}-hd{d}", len_q=lq, len_kv=lkv, dim=d, dtype=t,
                                           causal=1, alignment=al, tuning=wg))
    cases += [  # head dim 256 (wgmma N = 256 for P V, 64-key tiles)
        AttentionCase("wg-hd256-bfloat16", dim=256, tuning=wg),
        AttentionCase("wg-hd256-float16-causal-br", dim=256, dtype="float16", len_q=300, len_kv=1000, causal=1,
                      alignment="bottom_right", tuning=wg),
        AttentionCase("wg-hd256-len7x300-keylen", dim=256, len_q=7, len_kv=300, key_lengths=True, tuning=wg),
        AttentionCase("wg-hd256-additive-gqa", dim=256, mask="additive", heads_q=8, heads_kv=2, dtype="float16",
                      tuning=wg),
        AttentionCase("wg-hd256-bool-bhsd-causal", dim=256, mask="bool", layout="BHSD", len_q=200, len_kv=200,
                      causal=1, tuning=wg),
    ]
    cases += [
        AttentionCase("wg-softcap-hd64", scale=0.9, softcap=5.0, len_q=300, len_kv=700, dtype="float16", tuning=wg),
        AttentionCase("wg-softcap-additive-hd128", dim=128, softcap=2.0, mask="additive", tuning=wg),
        AttentionCase("wg-causal-2100-hd128", batch=1, heads_q=2, heads_kv=2, len_q=2100, len_kv=2100, dim=128,
                      causal=1, tuning=wg),
        AttentionCase("wg-causal-br-1500x2100-hd64", batch=1, heads_q=2, heads_kv=1, len_q=1500, len_kv=2100,
                      dtype="float16", causal=1, alignment="bottom_right", tuning=wg),
        AttentionCase("wg-long-kv-16534-hd128", batch=1, heads_q=2, heads_kv=2, len_q=7, len_kv=16534, dim=128,
                      tuning=wg),
        AttentionCase("wg-long-q-16534-hd64", batch=1, heads_q=2, heads_kv=1, len_q=16534, len_kv=127, tuning=wg),
        AttentionCase("wg-gqa-hd128", heads_q=8, heads_kv=2, dim=128, tuning=wg),
        AttentionCase("wg-mqa-bhsd-hd64", heads_q=6, heads_kv=1, layout="BHSD", dtype="float16", tuning=wg),
        AttentionCase("wg-cross-bhsd-hd128", len_q=77, len_kv=333, layout="BHSD", dim=128, tuning=wg),
        AttentionCase("wg-scale-hd128", scale=0.37, dim=128, dtype="float16", tuning=wg),
        AttentionCase("wg-negative-scale-hd64", scale=-0.2, dtype="float16", tuning=wg),
        AttentionCase("wg-key-lengths-hd64", key_lengths=True, len_kv=300, tuning=wg),
        AttentionCase("wg-key-lengths-causal-br-hd128", key_lengths=True, len_q=90, len_kv=300, causal=1,
                      alignment="bottom_right", dim=128, dtype="float16", tuning=wg),
        AttentionCase("wg-additive-full-hd64", mask="additive", tuning=wg),
        AttentionCase("wg-additive-b11k-hd128", mask="additive", mask_shape=(2, 1, 1, 127), dim=128, tuning=wg),
        AttentionCase("wg-additive-1hqk-gqa-hd64", mask="additive", mask_shape=(1, 8, 127, 127), heads_q=8,
                      heads_kv=2, dtype="float16", tuning=wg),
        AttentionCase("wg-bool-full-hd128", mask="bool", dim=128, dtype="float16", tuning=wg),
        AttentionCase("wg-bool-3d-causal-hd64", mask="bool", mask_shape=(1, 127, 200), len_kv=200, causal=1,
                      tuning=wg),
        AttentionCase("wg-bool-keylen-bhsd-hd128", mask="bool", mask_shape=(2, 1, 1, 127), key_lengths=True,
                      layout="BHSD", dim=128, tuning=wg),
        AttentionCase("wg-bn128-hd64-causal-br", len_q=300, len_kv=1000, causal=1, alignment="bottom_right",
                      tuning=bn128),
        AttentionCase("wg-bn128-hd64-fp16-bool", len_q=1000, len_kv=1000, mask="bool", dtype="float16", tuning=bn128),
        AttentionCase("wg-bn64-2blocks-hd128-fp16", len_q=1000, len_kv=1000, dim=128, dtype="float16", tuning=bn64_2),
        AttentionCase("wg-bn64-2blocks-hd128-causal", len_q=1000, len_kv=1000, dim=128, causal=1, tuning=bn64_2),
        AttentionCase("wg-bn64-hd128-bool-keylen", mask="bool", key_lengths=True, len_kv=300, dim=128, tuning=bn64),
    ]
    # WGMMA_OVERLAP=1: P V of tile t+1 in flight during the softmax of tile t
    cases += [AttentionCase(f"wg-overlap-hd{d}-{t}", dim=d, dtype=t, len_q=200, len_kv=1000, tuning=ov)
              for d in (64, 128) for t in ("float16", "bfloat16")]
    cases += [
        AttentionCase("wg-overlap-len1x1-hd128", len_q=1, len_kv=1, dim=128, tuning=ov),
        AttentionCase("wg-overlap-len7x300-hd64", len_q=7, len_kv=300, dtype="float16", tuning=ov),
        AttentionCase("wg-overlap-causal-2100-hd128", batch=1, heads_q=2, heads_kv=2, len_q=2100, len_kv=2100,
                      dim=128, causal=1, tuning=ov),
        AttentionCase("wg-overlap-causal-br-300x1000-hd64", len_q=300, len_kv=1000, causal=1,
                      alignment="bottom_right", dtype="float16", tuning=ov),
        AttentionCase("wg-overlap-key-lengths-hd128", key_lengths=True, len_kv=700, dim=128, tuning=ov),
        AttentionCase("wg-overlap-additive-gqa-hd64", mask="additive", heads_q=8, heads_kv=2, len_kv=500,
                      tuning=ov),
        AttentionCase("wg-overlap-bool-bhsd-hd128", mask="bool", mask_shape=(2, 1, 127, 400), len_kv=400,
                      layout="BHSD", dim=128, dtype="float16", tuning=ov),
        AttentionCase("wg-overlap-bn64-hd128-causal", len_q=1000, len_kv=1000, dim=128, causal=1,
                      tuning=ov + (("BLOCK_N", 64),)),
        AttentionCase("wg-overlap-bn128-hd64", len_q=1000, len_kv=1000, dtype="float16",
                      tuning=ov + (("BLOCK_N", 128), ("MIN_BLOCKS_PER_SM", 1))),
    ]
    return cases


WGMMA_CASES = _wgmma_cases()


def _warp_specialized_cases():
    """The warp-specialized Hopper kernel (tuning WARP_SPECIALIZED=1: load warpgroup, two MMA warpgroups in ping-pong)
    over the wgmma mainloop's feature cases (every feature, lengths 1..16534 so the K/V pipeline wraps its stages
    many times), the short ones also under compute-sanitizer."""
    ws = (("WARP_SPECIALIZED", 1),)
    small = {"ws-hd64-float16", "ws-hd128-bfloat16", "ws-hd256-bfloat16", "ws-len1x1-hd64",
             "ws-causal-bottom_right-100x300-hd64",
             "ws-key-lengths-hd64", "ws-additive-full-hd64", "ws-bool-keylen-bhsd-hd128"}
    cases = [replace(c, name="ws-" + c.name[3:], tuning=ws) for c in WGMMA_CASES if c.tuning == (("WGMMA", 1),)]
    ws3 = ws + (("KV_STAGES", 3),)  # three K/V stages (hd128: 226 KB of shared memory)
    # head dim 128's two-warpgroup tile with the overlap (its default when causal; non-causal takes three warpgroups)
    two_wg = (("BLOCK_M", 128), ("NUM_WARPS", 8), ("KV_STAGES", 3), ("PV_OVERLAP", 1))
    cases += [AttentionCase("ws3-hd128-causal-2100", batch=1, heads_q=2, heads_kv=2, len_q=2100, len_kv=2100, dim=128,
                            causal=1, tuning=ws3),
              AttentionCase("ws3-hd128-len7x1000-keylen", len_q=7, len_kv=1000, dim=128, key_lengths=True,
                            dtype="float16", tuning=ws + two_wg),
              AttentionCase("ws3-hd64-gqa-br", heads_q=8, heads_kv=2, len_q=300, len_kv=1000, causal=1,
                            alignment="bottom_right", tuning=ws3)]
    wg3 = ws + (("BLOCK_M", 192), ("NUM_WARPS", 12))  # three MMA warpgroups in the turn ring, 192-row tiles
    small |= {"ws-3wg-hd64-500x700", "ws-3wg-hd64-keylen-bhsd", "ws-3wg-hd128-bn64-causal-br"}
    cases += [AttentionCase("ws-3wg-hd64-500x700", len_q=500, len_kv=700, tuning=wg3),
              AttentionCase("ws-3wg-len1x1-hd64", len_q=1, len_kv=1, dtype="float16", tuning=wg3),
              AttentionCase("ws-3wg-hd64-keylen-bhsd", key_lengths=True, len_q=7, len_kv=1000, layout="BHSD",
                            tuning=wg3),
              AttentionCase("ws-3wg-hd64-causal-2100", batch=1, heads_q=2, heads_kv=2, len_q=2100, len_kv=2100,
                            causal=1, tuning=wg3),
              AttentionCase("ws-3wg-hd64-gqa-causal-br", heads_q=8, heads_kv=2, len_q=300, len_kv=1000, causal=1,
                            alignment="bottom_right", dtype="float16", tuning=wg3),
              AttentionCase("ws-3wg-hd64-long-kv-16534", batch=1, heads_q=2, heads_kv=2, len_q=200, len_kv=16534,
                            tuning=wg3),
              AttentionCase("ws-3wg-hd128-bn64-causal-br", dim=128, len_q=300, len_kv=700, causal=1,
                            alignment="bottom_right", dtype="float16", tuning=wg3 + (("BLOCK_N", 64),))]
    bn80 = ws + (("BLOCK_N", 80),)  # head dim 256 on 80-key tiles (two stages, 225 KB)
    small |= {"ws-hd256-bn80-keylen"}
    cases += [AttentionCase("ws-hd256-bn80", dim=256, len_q=300, len_kv=1000, tuning=bn80),
              AttentionCase("ws-hd256-bn80-keylen", dim=256, len_q=7, len_kv=300, key_lengths=True, tuning=bn80),
              AttentionCase("ws-hd256-bn80-causal-br-gqa", dim=256, heads_q=8, heads_kv=2, len_q=300, len_kv=1000,
                            causal=1, alignment="bottom_right", dtype="float16", tuning=bn80),
              AttentionCase("ws-hd256-bn80-causal-2100", batch=1, heads_q=2, heads_kv=2, len_q=2100, len_kv=2100,
                            dim=256, causal=1, tuning=bn80)]  # (with a mask's loads it spills: unmasked only)
    # the 16-bit loader copying whole K/V tiles without per-row bounds tests (KV_WHOLE_TILE_COPIES=1): keys ending
    # inside a tile and on a tile's edge, key lengths, causal bottom-right GQA on the persistent grid, three warpgroups
    whole = ws + (("KV_WHOLE_TILE_COPIES", 1),)
    small |= {"ws-whole-hd128-keylen-1000", "ws-whole-3wg-hd64-500x700", "ws-whole-persistent-hd256-causal-br-gqa"}
    cases += [AttentionCase("ws-whole-hd128-keylen-1000", dim=128, len_q=300, len_kv=1000, key_lengths=True,
                            tuning=whole),
              AttentionCase("ws-whole-hd128-causal-2048", batch=1, heads_q=2, heads_kv=2, len_q=2048, len_kv=2048,
                            dim=128, causal=1, tuning=whole),
              AttentionCase("ws-whole-3wg-hd64-500x700", len_q=500, len_kv=700, tuning=whole + wg3[1:]),
              AttentionCase("ws-whole-persistent-hd256-causal-br-gqa", dim=256, heads_q=8, heads_kv=2, len_q=300,
                            len_kv=1000, causal=1, alignment="bottom_right", dtype="float16",
                            tuning=whole + (("PERSISTENT_CTAS", 5),))]
    # the 16-bit loader keeping 2 or 3 copy groups in flight before publishing (KV_LOAD_LAG; 3 needs three stages)
    lag2, lag3 = ws + (("KV_LOAD_LAG", 2),), ws + (("KV_LOAD_LAG", 3),)
    lag3_two_wg = lag3 + two_wg
    small |= {"ws-hd128-lag3-keylen", "ws-hd128-lag2-len1x1", "ws-3wg-hd64-lag3-500x700"}
    cases += [AttentionCase("ws-hd128-lag2", dim=128, len_q=300, len_kv=1000, tuning=lag2),
              AttentionCase("ws-hd128-lag3-keylen", dim=128, len_q=7, len_kv=300, key_lengths=True,
                            tuning=lag3_two_wg),
              AttentionCase("ws-hd128-lag2-len1x1", dim=128, len_q=1, len_kv=1, dtype="float16", tuning=lag2),
              AttentionCase("ws-hd128-lag3-causal-2100", batch=1, heads_q=2, heads_kv=2, len_q=2100, len_kv=2100,
                            dim=128, causal=1, tuning=lag3),
              AttentionCase("ws-hd128-lag3-long-kv-16534", batch=1, heads_q=2, heads_kv=2, len_q=200, len_kv=16534,
                            dim=128, tuning=lag3_two_wg),
              AttentionCase("ws-hd256-lag2-causal-br-gqa", dim=256, heads_q=8, heads_kv=2, len_q=300, len_kv=1000,
                            causal=1, alignment="bottom_right", dtype="float16", tuning=lag2),
              AttentionCase("ws-hd256-lag2-keylen", dim=256, len_q=7, len_kv=300, key_lengths=True, tuning=lag2),
              AttentionCase("ws-3wg-hd64-lag3-500x700", len_q=500, len_kv=700, tuning=wg3 + (("KV_LOAD_LAG", 3),)),
              AttentionCase("ws-3wg-hd64-lag3-causal-2100", batch=1, heads_q=2, heads_kv=2, len_q=2100, len_kv=2100,
                            causal=1, tuning=wg3 + (("KV_LOAD_LAG", 3),))]
    # no intra-warpgroup overlap (PV_OVERLAP=0: P over S's registers), which lets head dim 256 run 128-key tiles with
    # one K/V stage (192 KB) and the loader publishing each group once it has landed (KV_LOAD_LAG=0); unmasked only
    serial = ws + (("PV_OVERLAP", 0),)
    n128 = serial + (("BLOCK_N", 128), ("KV_STAGES", 1), ("KV_LOAD_LAG", 0))
    small |= {"ws-hd256-bn128-serial-keylen", "ws-hd256-bn128-serial-len1x1"}
    cases += [AttentionCase("ws-hd256-bn128-serial", dim=256, len_q=300, len_kv=1000, tuning=n128),
              AttentionCase("ws-hd256-bn128-serial-keylen", dim=256, len_q=7, len_kv=300, key_lengths=True,
                            tuning=n128),
              AttentionCase("ws-hd256-bn128-serial-len1x1", dim=256, len_q=1, len_kv=1, dtype="float16",
                            tuning=n128),
              AttentionCase("ws-hd256-bn128-serial-causal-br-gqa", dim=256, heads_q=8, heads_kv=2, len_q=300,
                            len_kv=1000, causal=1, alignment="bottom_right", dtype="float16", tuning=n128),
              AttentionCase("ws-hd256-bn128-serial-causal-2100", batch=1, heads_q=2, heads_kv=2, len_q=2100,
                            len_kv=2100, dim=256, causal=1, tuning=n128),
              AttentionCase("ws-hd256-bn128-serial-long-kv-16534", batch=1, heads_q=2, heads_kv=2, len_q=200,
                            len_kv=16534, dim=256, tuning=n128),
              AttentionCase("ws-hd256-serial-causal-2100", batch=1, heads_q=2, heads_kv=2, len_q=2100, len_kv=2100,
                            dim=256, causal=1, dtype="float16", tuning=serial),
              AttentionCase("ws-hd128-serial-lag0-keylen", dim=128, len_q=7, len_kv=1000, key_lengths=True,
                            tuning=serial + (("KV_LOAD_LAG", 0),))]
    # head dim 256's default since v11 is the serial step: its previous step (PV_OVERLAP=1) stays a tuning; the serial
    # step with both products in the turn without a wait between them (SERIAL_PV_IN_TURN=2); the serial step on three
    # MMA warpgroups (hd64's tile; hd128 on 96-key tiles with three stages: 128-key ones with two spill 8 B when causal)
    overlap = ws + (("PV_OVERLAP", 1),)
    wg3_serial = wg3 + (("PV_OVERLAP", 0),)
    bn96 = wg3_serial + (("BLOCK_N", 96),)
    small |= {"ws-hd256-overlap-keylen", "ws-3wg-hd128-bn96-serial-keylen", "ws-3wg-hd64-serial-500x700",
              "ws-hd256-turn-both-keylen"}
    cases += [AttentionCase("ws-hd256-overlap-keylen", dim=256, len_q=7, len_kv=300, key_lengths=True, tuning=overlap),
              AttentionCase("ws-hd256-overlap-causal-2100", batch=1, heads_q=2, heads_kv=2, len_q=2100, len_kv=2100,
                            dim=256, causal=1, tuning=overlap),
              AttentionCase("ws-3wg-hd128-bn96-serial-keylen", dim=128, len_q=7, len_kv=1000, key_lengths=True,
                            tuning=bn96),
              AttentionCase("ws-3wg-hd128-bn96-serial-causal-2100", batch=1, heads_q=2, heads_kv=2, len_q=2100,
                            len_kv=2100, dim=128, causal=1, tuning=bn96),
              AttentionCase("ws-3wg-hd128-bn96-serial-causal-br-gqa", dim=128, heads_q=8, heads_kv=2, len_q=300,
                            len_kv=1000, causal=1, alignment="bottom_right", dtype="float16", tuning=bn96),
              AttentionCase("ws-3wg-hd128-bn96-serial-long-kv-16534", batch=1, heads_q=2, heads_kv=2, len_q=200,
                            len_kv=16534, dim=128, tuning=bn96),
              AttentionCase("ws-hd256-turn-both-causal-2100", batch=1, heads_q=2, heads_kv=2, len_q=2100,
                            len_kv=2100, dim=256, causal=1, tuning=ws + (("SERIAL_PV_IN_TURN", 2),)),
              AttentionCase("ws-hd256-turn-both-keylen", dim=256, len_q=7, len_kv=300, key_lengths=True,
                            tuning=ws + (("SERIAL_PV_IN_TURN", 2),)),
              AttentionCase("ws-hd128-turn-both-causal-br-gqa", dim=128, heads_q=8, heads_kv=2, len_q=300,
                            len_kv=1000, causal=1, alignment="bottom_right", dtype="float16",
                            tuning=serial + (("SERIAL_PV_IN_TURN", 2),)),
              AttentionCase("ws-3wg-hd64-serial-500x700", len_q=500, len_kv=700, tuning=wg3_serial),
              AttentionCase("ws-3wg-hd64-serial-causal-2100", batch=1, heads_q=2, heads_kv=2, len_q=2100,
                            len_kv=2100, causal=1, dtype="float16", tuning=wg3_serial)]
    # the persistent grid (PERSISTENT_CTAS: at most that many CTAs, each computing several query tiles; under causal
    # masking a work item is a long and a short block): few CTAs so each runs many tiles, K/V steps and Q buffers
    # counted on across them (two Q buffers at hd128 non-causal and hd64, one at hd128 causal and hd256), odd block
    # counts (a lone middle block), key lengths, and the SM-count grid on more items than CTAs
    def persistent(ctas):
        return ws + (("PERSISTENT_CTAS", ctas),)
    small |= {"ws-persistent-hd128-500", "ws-persistent-hd128-causal-800", "ws-persistent-hd256-causal-br-gqa-keylen",
              "ws-persistent-3wg-hd64-keylen-bhsd", "ws-persistent-hd128-len1x1"}
    cases += [AttentionCase("ws-persistent-hd128-500", dim=128, heads_q=2, heads_kv=2, len_q=500, len_kv=500,
                            tuning=persistent(3)),
              AttentionCase("ws-persistent-hd128-causal-800", batch=1, heads_q=2, heads_kv=2, len_q=800, len_kv=800,
                            dim=128, causal=1, tuning=persistent(3)),
              AttentionCase("ws-persistent-hd256-causal-br-gqa-keylen", dim=256, heads_q=8, heads_kv=2, len_q=300,
                            len_kv=1000, causal=1, alignment="bottom_right", key_lengths=True, dtype="float16",
                            tuning=persistent(5)),
              AttentionCase("ws-persistent-3wg-hd64-keylen-bhsd", len_q=700, len_kv=500, key_lengths=True,
                            layout="BHSD", tuning=persistent(4) + (("BLOCK_M", 192), ("NUM_WARPS", 12))),
              AttentionCase("ws-persistent-hd128-len1x1", dim=128, len_q=1, len_kv=1, dtype="float16",
                            tuning=persistent(2)),
              AttentionCase("ws-persistent-hd128-causal-2100", batch=2, heads_q=8, heads_kv=8, len_q=2100,
                            len_kv=2100, dim=128, causal=1, tuning=persistent(132)),
              # the plan's default: the persistent grid for causal self-attention from 2k (256 items, 132 CTAs)
              AttentionCase("ws-persistent-default-causal-gqa-2048", batch=2, heads_q=16, heads_kv=4, len_q=2048,
                            len_kv=2048, dim=128, causal=1),
              AttentionCase("ws-persistent-hd256-2100", batch=2, heads_q=8, heads_kv=8, len_q=2100, len_kv=2100,
                            dim=256, tuning=persistent(132)),
              AttentionCase("ws-persistent-3wg-hd64-causal-2100", batch=2, heads_q=8, heads_kv=8, len_q=2100,
                            len_kv=2100, causal=1, dtype="float16",
                            tuning=persistent(132) + (("BLOCK_M", 192), ("NUM_WARPS", 12)))]
    return [replace(c, small=c.name in small) for c in cases]


WARP_SPECIALIZED_CASES = _warp_specialized_cases()


def _split_kv_cases():
    """Decode and short queries with the keys split over a thread-block cluster (tuning KV_SPLIT, the mma.sync mainloop,
    sm_90): uneven splits, more CTAs than tiles, key lengths 0 and 1, causal bottom-right, GQA, masks."""
    dec = (("WGMMA", 0), ("BLOCK_M", 16), ("NUM_WARPS", 1), ("BLOCK_N", 64))
    m64 = (("WGMMA", 0), ("BLOCK_M", 64), ("NUM_WARPS", 4), ("BLOCK_N", 64))
    return [
        AttentionCase("split8-decode-gqa-1x4100", heads_q=8, heads_kv=2, len_q=1, len_kv=4100, dim=128,
                      tuning=dec + (("KV_SPLIT", 8),), small=True),
        AttentionCase("split4-16x3000-causal-br", len_q=16, len_kv=3000, dim=128, causal=1, alignment="bottom_right",
                      dtype="float16", tuning=dec + (("KV_SPLIT", 4),)),
        AttentionCase("split4-keylen-len1", len_q=1, len_kv=1, dim=128, key_lengths=True,
                      tuning=dec + (("KV_SPLIT", 4),), small=True),
        AttentionCase("split8-keylen-300", len_q=3, len_kv=300, key_lengths=True, tuning=dec + (("KV_SPLIT", 8),)),
        AttentionCase("split2-bool-m64", len_q=50, len_kv=2000, mask="bool", mask_shape=(2, 1, 1, 2000), dim=128,
                      tuning=m64 + (("KV_SPLIT", 2),)),
        AttentionCase("split4-additive-hd64-fp16", len_q=7, len_kv=2000, mask="additive", dtype="float16",
                      tuning=m64 + (("KV_SPLIT", 4),)),
        AttentionCase("split8-more-ctas-than-tiles", len_q=5, len_kv=100, dim=128, tuning=dec + (("KV_SPLIT", 8),)),
        AttentionCase("split4-softcap-hd40", len_q=2, len_kv=1500, dim=40, softcap=3.0, scale=0.5,
                      tuning=dec + (("KV_SPLIT", 4),)),
    ]


SPLIT_KV_CASES = _split_kv_cases()
