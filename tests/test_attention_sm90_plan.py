"""plan_attention's choice between the mma.sync and the Hopper wgmma mainloops (CPU): the WGMMA tuning override,
the WGMMA_BY_DEFAULT switch, the wgmma tile geometry and shared memory, and one-line rejections."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trt_fusedattn.plugins.attention import plan as plan_module
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.plan import WGMMA_TILES, plan_attention, shared_mem_bytes


def plan(dim=128, arch="sm_90a", tuning=None, mask=None):
    q, kv = (2, 1000, 8, dim), (2, 700, 2, dim)
    return plan_attention([q, kv, kv, mask, None], ["bfloat16"] * 3 + [None if mask is None else "bool", None],
                          FUSED_ATTENTION.resolve({"causal": 1}), arch, tuning=tuning)


@pytest.mark.parametrize("dim", sorted(WGMMA_TILES))
def test_forced_wgmma_geometry(dim):
    p = plan(dim, tuning={"WGMMA": 1})
    block_m, block_n, warps, q_regs, stages = WGMMA_TILES[dim]
    assert p.defines["WGMMA"] == 1 and p.defines["Q_IN_REGISTERS"] == 0
    assert p.block == (warps * 32, 1, 1) and warps == block_m // 16 and warps % 4 == 0  # 64 rows per warpgroup
    assert p.grid == ((1000 + block_m - 1) // block_m, 8, 2)
    # unpadded tiles + slack for the kernel's round-up of its smem base to 1024 bytes
    assert p.shared_mem == (block_m + 2 * stages * block_n) * dim * 2 + 1024 - 16 <= 227 * 1024
    assert plan(dim, tuning={"WGMMA": 1}, mask=(2, 1, 1000, 700)).defines["WGMMA"] == 1  # masks too


def test_default_follows_the_switch(monkeypatch):
    monkeypatch.setattr(plan_module, "WGMMA_BY_DEFAULT", False)
    assert plan(128).defines["WGMMA"] == 0
    monkeypatch.setattr(plan_module, "WGMMA_BY_DEFAULT", True)
    assert plan(128).defines["WGMMA"] == 1 and plan(64).defines["WGMMA"] == 1
    assert plan(96).defines["WGMMA"] == 0 and plan(128, arch="sm_80").defines["WGMMA"] == 0
    assert plan(128, tuning={"WGMMA": 0}).defines["WGMMA"] == 0  # the mma.sync path stays reachable
    assert plan(128, tuning={"WGMMA": 0}).shared_mem == shared_mem_bytes(128, 128, 64, 2)


@pytest.mark.parametrize("dim, arch", [(96, "sm_90a"), (128, "sm_80"), (64, "sm_89")])
def test_forcing_wgmma_where_it_cannot_run_is_rejected(dim, arch):
    with pytest.raises(ValueError, match="wgmma mainloop runs on sm_90a"):
        plan(dim, arch=arch, tuning={"WGMMA": 1})


def test_overlap_takes_a_third_v_tile_and_needs_wgmma():
    base = plan(128, tuning={"WGMMA": 1, "WGMMA_OVERLAP": 0})
    over = plan(128, tuning={"WGMMA": 1, "WGMMA_OVERLAP": 1})
    block_n = WGMMA_TILES[128][1]
    assert over.defines["WGMMA_OVERLAP"] == 1 and over.shared_mem - base.shared_mem == block_n * 128 * 2
    with pytest.raises(ValueError, match="WGMMA_OVERLAP is an option of the wgmma mainloop"):
        plan(128, tuning={"WGMMA": 0, "WGMMA_OVERLAP": 1})


@pytest.mark.parametrize("dim", [64, 128])
def test_warp_specialized_geometry(dim):
    """WARP_SPECIALIZED=1: attention_sm90.cu, a load warpgroup beside two MMA warpgroups, the pipeline's mbarriers
    after the swizzled tiles."""
    from trt_fusedattn.plugins.attention.plan import WARP_SPECIALIZED_TILES, pipeline_barrier_bytes
    p = plan(dim, tuning={"WARP_SPECIALIZED": 1})
    block_m, block_n, warps, _, stages = WARP_SPECIALIZED_TILES[dim]
    assert p.source.name == "attention_sm90.cu" and p.defines["WGMMA"] == 1 and p.defines["WGMMA_OVERLAP"] == 0
    assert p.block == (128 + warps * 32, 1, 1) and p.grid == ((1000 + block_m - 1) // block_m, 8, 2)
    assert p.shared_mem == shared_mem_bytes(dim, block_m, block_n, stages, True) + pipeline_barrier_bytes(stages)
    assert p.shared_mem <= 227 * 1024
    default = plan_module.WGMMA_BY_DEFAULT and dim in plan_module.WARP_SPECIALIZED_DEFAULT_HEAD_DIMS
    assert plan(dim).source.name == ("attention_sm90.cu" if default else "attention.cu")
    assert plan(dim, mask=(2, 1, 1000, 700)).source.name == "attention.cu"  # masked tiles: untimed, not the default
    assert plan(dim, tuning={"WGMMA": 1}).source.name == "attention.cu"  # forcing WGMMA means the wgmma mainloop


@pytest.mark.parametrize("tuning, message", [
    ({"WARP_SPECIALIZED": 1, "WGMMA": 0}, "needs WGMMA=1"),
    ({"WARP_SPECIALIZED": 1, "WGMMA_OVERLAP": 1}, "own overlap"),
    ({"WARP_SPECIALIZED": 1, "NUM_WARPS": 4, "BLOCK_M": 64}, "two or three MMA warpgroups"),
    ({"WARP_SPECIALIZED": 1, "NUM_WARPS": 12, "BLOCK_M": 128}, "two or three MMA warpgroups"),
])
def test_warp_specialized_rejections(tuning, message):
    with pytest.raises(ValueError, match=message):
        plan(128, tuning=tuning)
    with pytest.raises(ValueError, match="WGMMA=1"):
        plan(96, tuning={"WARP_SPECIALIZED": 1})


@pytest.mark.parametrize("dim, block_n", [(64, 128), (128, 64)])
def test_warp_specialized_three_mma_warpgroups(dim, block_n):
    """BLOCK_M=192, NUM_WARPS=12: a load warpgroup beside three MMA warpgroups (512 threads), 192-row query tiles."""
    from trt_fusedattn.plugins.attention.plan import pipeline_barrier_bytes
    stages = plan_module.WARP_SPECIALIZED_TILES[dim][4]
    p = plan(dim, tuning={"WARP_SPECIALIZED": 1, "BLOCK_M": 192, "NUM_WARPS": 12, "BLOCK_N": block_n})
    assert p.source.name == "attention_sm90.cu" and p.block == (512, 1, 1) and p.grid == ((1000 + 191) // 192, 8, 2)
    assert p.shared_mem == shared_mem_bytes(dim, 192, block_n, stages, True) + pipeline_barrier_bytes(stages)


def test_head_dim_64_takes_the_warp_specialized_kernel_on_long_static_rows():
    def hd64(length, causal=0):
        return plan_attention([(1, length, 16, 64)] * 3 + [None, None], ["bfloat16"] * 3 + [None, None],
                              FUSED_ATTENTION.resolve({"causal": causal}), "sm_90a")
    assert hd64(2048).source.name == "attention_sm90.cu" and hd64(2048).defines["KV_STAGES"] == 3
    assert hd64(2048).block == (512, 1, 1) and hd64(2048).defines["BLOCK_M"] == 192  # three MMA warpgroups
    assert hd64(4096, causal=1).source.name == hd64(1500).source.name == "attention_sm90.cu"  # (1500: Whisper)
    assert hd64(1024).source.name == hd64(2048, causal=1).source.name == "attention.cu"


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_head_dim_64_keeps_two_mma_warpgroups_with_a_mask_or_softcap(dtype):
    """Three MMA warpgroups (160 registers) for plain hd64 tiles; a mask's loads or the softcap spill there, so those
    keep two (128-row tiles, 240 registers)."""
    shape, fp8 = (2, 4096, 8, 64), dtype != "bfloat16"
    scales = {"q_scale": 0.1, "k_scale": 0.1, "v_scale": 0.1} if fp8 else {}

    def hd64(mask=None, softcap=0.0):
        attrs = FUSED_ATTENTION.resolve({"softcap": softcap, **scales})
        return plan_attention([shape] * 3 + [mask, None], [dtype] * 3 + [None if mask is None else "bool", None],
                              attrs, "sm_90a", tuning={"WARP_SPECIALIZED": 1})
    assert hd64().block == (512, 1, 1) and hd64().defines["BLOCK_M"] == 192
    for p in (hd64(mask=(2, 1, 4096, 4096)), hd64(softcap=5.0)):
        assert p.block == (384, 1, 1) and p.defines["BLOCK_M"] == 128


def test_fp8_takes_the_warp_specialized_kernel_with_its_scales():
    """FP8 Q/K/V: attention_sm90.cu with FP8=1, the dequantization folded into SCALE_LOG2, P's scale into the
    exponent, v_scale (over output_scale) into the epilogue, the running max moving whenever it grows; V staging tiles
    in shared memory; an additive mask in the output's dtype."""
    import math
    from trt_fusedattn.plugins.attention.plan import FP8_LOAD_LAG, FP8_TILES_MASKED
    attrs = FUSED_ATTENTION.resolve({"causal": 1, "q_scale": 0.5, "k_scale": 0.25, "v_scale": 0.125,
                                     "output_dtype": "float8e4m3fn", "output_scale": 0.0625})
    q, kv = (2, 1000, 8, 128), (2, 700, 2, 128)
    p = plan_attention([q, kv, kv, (2, 8, 1000, 700), None], ["float8_e4m3fn"] * 3 + ["float16", None], attrs,
                       "sm_90a")
    d = p.defines
    assert p.source.name == "attention_sm90.cu" and d["FP8"] == 1 and d["WARP_SPECIALIZED"] == 1
    assert d["OUTPUT_E4M3"] == 1 and float(d["OUTPUT_FACTOR"][:-1]) == 2.0 and d["RESCALE_THRESHOLD"] == "0.0f"
    assert math.isclose(float(d["SCALE_LOG2"][:-1]), 0.5 * 0.25 / math.sqrt(128) * math.log2(math.e), rel_tol=1e-7)
    assert math.isclose(float(d["P_SCALE_LOG2"][:-1]), math.log2(448), rel_tol=1e-7)
    block_m, block_n, _, _, stages = FP8_TILES_MASKED[128]
    staging = FP8_LOAD_LAG[128] + 1
    assert p.shared_mem == (block_m + (2 * stages + staging) * block_n) * 128 + 1008 + (1 + 4 * stages) * 8 <= 227 * 1024
    bf16 = dict(attrs, output_dtype="bfloat16", output_scale=0.0)
    assert plan_attention([q, kv, kv, None, None], ["float8_e4m3fn"] * 3 + [None, None], bf16,
                          "sm_90a").defines["DTYPE_BF16"] == 1


@pytest.mark.parametrize("arch, dim, message", [
    ("sm_89", 128, "FP8 .* runs on sm_90a for head dims 64, 128, 256"),
    ("sm_90a", 96, "FP8 .* runs on sm_90a for head dims 64, 128, 256"),
])
def test_fp8_refusals_are_one_line(arch, dim, message):
    attrs = FUSED_ATTENTION.resolve({"q_scale": 1.0, "k_scale": 1.0, "v_scale": 1.0})
    shape = (1, 64, 2, dim)
    with pytest.raises(ValueError, match=message) as err:
        plan_attention([shape] * 3 + [None, None], ["float8_e4m3fn"] * 3 + [None, None], attrs, arch)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="warp-specialized kernel only"):
        plan_attention([(1, 64, 2, 128)] * 3 + [None, None], ["float8_e4m3fn"] * 3 + [None, None], attrs, "sm_90a",
                       tuning={"WARP_SPECIALIZED": 0})
    with pytest.raises(ValueError, match="all float8e4m3fn or none"):
        plan_attention([(1, 64, 2, 128)] * 3 + [None, None], ["float8_e4m3fn", "float16", "float8_e4m3fn", None, None],
                       attrs, "sm_90a")


@pytest.mark.skipif(not shutil.which("nvcc") and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="nvcc not found")
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [0, 1])
def test_default_warp_specialized_tiles_keep_their_wgmmas_asynchronous(dtype, dim, causal):
    """ptxas serializes every wgmma (info C7512) when the MMA warpgroups' registers cannot hold the in-flight
    accumulators: the plan's warp-specialized tiles (forced for bf16 head dim 64) must not be such a tile."""
    from trt_fusedattn.launcher import compile_cubin
    fp8 = dtype == "float8_e4m3fn"
    attrs = {"causal": causal, **({"q_scale": 0.01, "k_scale": 0.01, "v_scale": 0.01} if fp8 else {})}
    p = plan_attention([(2, 4096, 2048 // dim, dim)] * 3 + [None, None], [dtype] * 3 + [None, None],
                       FUSED_ATTENTION.resolve(attrs), "sm_90a",
                       tuning={"WARP_SPECIALIZED": 1} if dim == 64 and not fp8 else None)
    assert p.source.name == "attention_sm90.cu"
    report = compile_cubin(p.source, "sm_90a", p.defines)[1]
    assert "serialized" not in report, report


def test_loader_lag_is_a_tuning_of_the_16_bit_warp_specialized_kernel():
    """KV_LOAD_LAG (copy groups the loader keeps in flight) is set on the 16-bit warp-specialized kernel only."""
    assert plan(128).defines["KV_LOAD_LAG"] == plan_module.WARP_SPECIALIZED_LOAD_LAG
    assert plan(128, tuning={"KV_LOAD_LAG": 3}).defines["KV_LOAD_LAG"] == 3
    assert "KV_LOAD_LAG" not in plan(128, tuning={"WGMMA": 1}).defines
    with pytest.raises(ValueError, match="unknown tuning defines"):
        plan(128, tuning={"WGMMA": 1, "KV_LOAD_LAG": 2})


def test_pv_overlap_is_a_tuning_of_the_warp_specialized_kernel():
    """PV_OVERLAP (P V under the softmax, or P over S's registers) is set on the warp-specialized kernel only;
    one K/V stage needs the loader to publish each group once it has landed (KV_LOAD_LAG=0), else it would wait for
    a stage that only its own unpublished K tile can free."""
    assert plan(256).defines["PV_OVERLAP"] == plan_module.WARP_SPECIALIZED_PV_OVERLAP[256] == 0
    assert plan(128).defines["PV_OVERLAP"] == plan_module.WARP_SPECIALIZED_PV_OVERLAP[128] == 1
    assert plan(256, tuning={"PV_OVERLAP": 1}).defines["PV_OVERLAP"] == 1
    one_stage = {"BLOCK_N": 128, "KV_STAGES": 1, "PV_OVERLAP": 0}
    assert plan(256, tuning={**one_stage, "KV_LOAD_LAG": 0}).defines["KV_STAGES"] == 1
    with pytest.raises(ValueError, match="0 with one stage"):
        plan(256, tuning={**one_stage, "KV_LOAD_LAG": 1})
    with pytest.raises(ValueError, match="at most KV_STAGES=2"):
        plan(256, tuning={"KV_LOAD_LAG": 3})
    with pytest.raises(ValueError, match="unknown tuning defines"):
        plan(128, tuning={"WGMMA": 1, "PV_OVERLAP": 0})


@pytest.mark.skipif(not shutil.which("nvcc") and not Path("/usr/local/cuda/bin/nvcc").exists(), reason="nvcc not found")
def test_pv_overlap_off_keeps_head_dim_256_on_128_key_tiles_asynchronous():
    """Without intra-warpgroup overlap the MMA warpgroups hold O (128 registers) and a 128-key S (64) at head dim 256:
    ptxas must neither spill nor serialize the wgmmas (with the overlap that tile spills and serializes)."""
    from trt_fusedattn.launcher import compile_cubin
    for causal in (0, 1):
        p = plan_attention([(2, 4096, 8, 256)] * 3 + [None, None], ["bfloat16"] * 3 + [None, None],
                           FUSED_ATTENTION.resolve({"causal": causal}), "sm_90a",
                           tuning={"BLOCK_N": 128, "KV_STAGES": 1, "KV_LOAD_LAG": 0, "PV_OVERLAP": 0,
                                   "PERSISTENT_CTAS": 0})
        report = compile_cubin(p.source, "sm_90a", p.defines)[1]
        assert "serialized" not in report and "0 bytes spill stores" in report, report


def test_fp8_transpose_batch_of_four_needs_two_serial_mma_warpgroups():
    """V_TRANSPOSE_BATCH=4 gives the FP8 loader 56 registers out of two MMA warpgroups that run the serial step."""
    attrs = FUSED_ATTENTION.resolve({"q_scale": 0.5, "k_scale": 0.25, "v_scale": 0.125})

    def fp8(dim, tuning):
        q = (2, 1000, 8, dim)
        return plan_attention([q, q, q, None, None], ["float8_e4m3fn"] * 3 + [None, None], attrs, "sm_90a",
                              tuning=tuning)
    assert fp8(256, None).defines["V_TRANSPOSE_BATCH"] == 2
    assert fp8(256, {"V_TRANSPOSE_BATCH": 4}).defines["V_TRANSPOSE_BATCH"] == 4
    for dim, bad in ((256, {"V_TRANSPOSE_BATCH": 3}), (256, {"V_TRANSPOSE_BATCH": 4, "PV_OVERLAP": 1}),
                     (128, {"V_TRANSPOSE_BATCH": 4})):
        with pytest.raises(ValueError, match="V_TRANSPOSE_BATCH is 2 or 4, and 4 .* needs two MMA warpgroups"):
            fp8(dim, bad)


def test_fp8_loader_instruction_cuts_are_the_head_dim_256_default():
    """VT_ADDRESS_STEP (the V transpose's addresses stepped a column strip) and KV_WHOLE_TILE_COPIES: the FP8 default
    at head dim 256 only (attn-fp8-2), 0 or 1 as tunings."""
    attrs = FUSED_ATTENTION.resolve({"q_scale": 0.5, "k_scale": 0.25, "v_scale": 0.125})

    def fp8(dim, tuning=None):
        q = (2, 1000, 8, dim)
        return plan_attention([q, q, q, None, None], ["float8_e4m3fn"] * 3 + [None, None], attrs, "sm_90a",
                              tuning=tuning).defines
    for dim, on in ((64, 0), (128, 0), (256, 1)):
        assert fp8(dim)["VT_ADDRESS_STEP"] == on and fp8(dim)["KV_WHOLE_TILE_COPIES"] == on
    assert fp8(128, {"VT_ADDRESS_STEP": 1})["VT_ADDRESS_STEP"] == 1
    with pytest.raises(ValueError, match="VT_ADDRESS_STEP is 0 or 1"):
        fp8(128, {"VT_ADDRESS_STEP": 2})


def test_fp8_causal_head_dim_128_takes_two_mma_warpgroups_on_256_key_tiles():
    """Unmasked causal FP8 hd128 (key lengths too): two MMA warpgroups x 256-key tiles, serial step, two stages, lag 1,
    the loader trims (FP8_CAUSAL, attn-fp8-2); without causal masking three warpgroups x 128 keys; a mask keeps the
    masked tile; other head dims keep their tiles."""
    def fp8(dim=128, causal=1, mask=None, lengths=None):
        attrs = FUSED_ATTENTION.resolve({"causal": causal, "q_scale": 0.5, "k_scale": 0.25, "v_scale": 0.125})
        q = (2, 1000, 8, dim)
        return plan_attention([q, q, q, mask, lengths], ["float8_e4m3fn"] * 3 + [mask and "bool", lengths and "int32"],
                              attrs, "sm_90a").defines

    def tile(d):
        return tuple(d[k] for k in ("BLOCK_M", "BLOCK_N", "NUM_WARPS", "KV_STAGES", "KV_LOAD_LAG", "PV_OVERLAP",
                                    "VT_ADDRESS_STEP", "KV_WHOLE_TILE_COPIES"))
    assert tile(fp8()) == tile(fp8(lengths=(2,))) == (128, 256, 8, 2, 1, 0, 1, 1)
    assert tile(fp8(causal=0)) == (192, 128, 12, 3, 2, 0, 0, 0)
    assert tile(fp8(mask=(2, 8, 1000, 1000)))[:4] == (128, 128, 8, 3)
    assert fp8(64)["BLOCK_N"] == 128 and fp8(256)["BLOCK_N"] == 128


def test_head_dim_128_without_causal_masking_takes_three_mma_warpgroups_serially():
    """Unmasked 16-bit hd128 without causal masking: three MMA warpgroups on 128-key tiles, two K/V stages, the serial
    step (WARP_SPECIALIZED_NON_CAUSAL); causal keeps two warpgroups with the overlap, soft-capped the masked tile."""
    def hd128(causal=0, softcap=0.0, dtype="bfloat16"):
        attrs = FUSED_ATTENTION.resolve({"causal": causal, "softcap": softcap})
        return plan_attention([(2, 4096, 16, 128)] * 3 + [None, None], [dtype] * 3 + [None, None], attrs,
                              "sm_90a").defines
    tile, overlap = plan_module.WARP_SPECIALIZED_NON_CAUSAL[128]
    d = hd128()
    assert (d["BLOCK_M"], d["BLOCK_N"], d["NUM_WARPS"], d["Q_IN_REGISTERS"], d["KV_STAGES"]) == tile
    assert tile == (192, 128, 12, 0, 2)
    assert d["PV_OVERLAP"] == overlap == 0 and hd128(dtype="float16")["BLOCK_M"] == 192
    causal = hd128(causal=1)
    assert (causal["BLOCK_M"], causal["PV_OVERLAP"]) == (plan_module.WARP_SPECIALIZED_TILES[128][0], 1)
    assert hd128(softcap=2.0)["BLOCK_M"] == 128


def test_persistent_grid_is_a_tuning_of_the_16_bit_warp_specialized_kernel():
    """PERSISTENT_CTAS (attention_persistent_scheduler_sm90.cuh): 0 by default but for the causal rule of the next
    test (one CTA a query tile, 3-D grid); else a 1-D grid of min(work items, PERSISTENT_CTAS) CTAs, an item being a query block, or under causal masking a
    pair of them (the middle one alone when the count is odd), the same for TensorRT's symbolic dims; a second Q
    buffer where it fits; FP8 and the single-role kernel refuse it."""
    from test_attention_plan import Symbolic
    from trt_fusedattn.launcher.arch import SM_COUNT

    def ws(batch, length, dim=128, causal=0, ctas=SM_COUNT, dtype="bfloat16"):
        scales = {"q_scale": 1.0, "k_scale": 1.0, "v_scale": 1.0} if dtype == "float8_e4m3fn" else {}
        attrs = FUSED_ATTENTION.resolve({"causal": causal, **scales})
        tuning = {"PERSISTENT_CTAS": ctas} if ctas is not None else None
        return plan_attention([(batch, length, 16, dim)] * 3 + [None, None], [dtype] * 3 + [None, None], attrs,
                              "sm_90a", tuning=tuning)
    default = ws(4, 4096, ctas=None)
    assert default.defines["PERSISTENT_CTAS"] == 0 and "Q_STAGES" not in default.defines
    assert default.grid == (22, 16, 4)
    for causal in (0, 1):
        for batch, length in ((8, 2048), (1, 300), (1, 128 * SM_COUNT), (3, 128 * SM_COUNT - 1), (2, 2 ** 20)):
            block_m = ws(batch, length, causal=causal).defines["BLOCK_M"]
            blocks = -(-length // block_m)
            items = -(-blocks // (1 + causal)) * 16 * batch
            grid = ws(Symbolic(batch), Symbolic(length), causal=causal).grid
            assert int(grid[0]) == ws(batch, length, causal=causal).grid[0] == min(items, SM_COUNT)
    assert ws(1, 300, ctas=3).grid == (3, 1, 1)
    # two Q buffers beside hd128's two K/V stages of 192 x 128 (230,480 B) and hd64's; one beside hd128's causal three
    # stages and hd256's
    assert ws(4, 4096).defines["Q_STAGES"] == 2 and ws(4, 4096, dim=64).defines["Q_STAGES"] == 2
    assert ws(4, 4096, causal=1).defines["Q_STAGES"] == 1 and ws(4, 4096, dim=256).defines["Q_STAGES"] == 1
    assert max(ws(4, 4096, d, c).shared_mem for d in (64, 128, 256) for c in (0, 1)) <= 227 * 1024
    with pytest.raises(ValueError, match="unknown tuning defines.*PERSISTENT_CTAS"):
        ws(4, 4096, dtype="float8_e4m3fn")
    with pytest.raises(ValueError, match="PERSISTENT_CTAS"):
        plan(tuning={"WGMMA": 1, "PERSISTENT_CTAS": 132})



def test_persistent_grid_by_default_for_causal_self_attention_2k_to_8k():
    """The plan takes the persistent grid (SM_COUNT CTAs) by default for plain causal self-attention with Lq = Lkv
    in WARP_SPECIALIZED_PERSISTENT_CAUSAL_LENS whose causal work items fill the SMs (v13c, H100 job attn-ws-1 of
    session 9); one CTA a query tile for non-causal, 16k, 1k, a mask, a softcap, key lengths, Lq < Lkv (chunked
    prefill), too few items and symbolic lengths; PERSISTENT_CTAS=0 still forces one CTA a tile."""
    from test_attention_plan import Symbolic
    from trt_fusedattn.launcher.arch import SM_COUNT

    def ctas(batch=4, length=2048, heads=32, heads_kv=8, dim=128, causal=1, len_kv=None, mask=False, lengths=False,
             softcap=0.0, dtype="bfloat16", tuning=None):
        attrs = FUSED_ATTENTION.resolve({"causal": causal, "softcap": softcap})
        kv = (batch, len_kv or length, heads_kv, dim)
        shapes = [(batch, length, heads, dim), kv, kv, (batch, heads, length, len_kv or length) if mask else None,
                  (batch,) if lengths else None]
        dtypes = [dtype] * 3 + ["bool" if mask else None, "int32" if lengths else None]
        p = plan_attention(shapes, dtypes, attrs, "sm_90a", tuning=tuning)
        assert not p.defines.get("PERSISTENT_CTAS") or p.grid[1:] == (1, 1)
        return p.defines.get("PERSISTENT_CTAS", 0)

    # Llama-3-8B prefill 4x2048 and 1x4096 (GQA), hd256, fp16, the 8k bound
    assert ctas() == ctas(1, 4096) == ctas(8, 2048, 8, 8, dim=256) == ctas(dtype="float16") == ctas(2, 8192) == SM_COUNT
    assert ctas(causal=0) == ctas(1, 16384) == ctas(16, 1024) == ctas(mask=True) == ctas(lengths=True) == 0
    assert ctas(softcap=30.0) == ctas(1, 512, len_kv=4096) == ctas(1, 2048, 2, 2) == 0
    assert ctas(Symbolic(4), Symbolic(2048)) == ctas(tuning={"PERSISTENT_CTAS": 0}) == 0
    # at the edge the item count decides (2048 causal rows in blocks of 128: 8 items a (batch, head))
    items = (-(-2048 // plan_module.WARP_SPECIALIZED_TILES[128][0]) + 1) // 2
    assert ctas(1, 2048, -(-SM_COUNT // items), -(-SM_COUNT // items)) == SM_COUNT
    assert ctas(1, 2048, SM_COUNT // items - 1, SM_COUNT // items - 1) == 0


def test_whole_tile_copies_are_an_option_of_both_loaders():
    """KV_WHOLE_TILE_COPIES (attention_load_sm90.cuh): the warp-specialized loaders' choice of copying whole K/V
    tiles without per-row bounds tests, 16-bit (WARP_SPECIALIZED_WHOLE_TILE_COPIES) and FP8 (FP8_KV_WHOLE_TILE_COPIES)."""
    assert plan(128).defines["KV_WHOLE_TILE_COPIES"] == plan_module.WARP_SPECIALIZED_WHOLE_TILE_COPIES
    assert plan(256, tuning={"KV_WHOLE_TILE_COPIES": 1}).defines["KV_WHOLE_TILE_COPIES"] == 1
    attrs = FUSED_ATTENTION.resolve({"q_scale": 1.0, "k_scale": 1.0, "v_scale": 1.0})

    def fp8(tuning=None):
        return plan_attention([(2, 4096, 16, 128)] * 3 + [None, None], ["float8_e4m3fn"] * 3 + [None, None], attrs,
                              "sm_90a", tuning=tuning).defines["KV_WHOLE_TILE_COPIES"]
    assert fp8() == plan_module.FP8_KV_WHOLE_TILE_COPIES[128] and fp8({"KV_WHOLE_TILE_COPIES": 1}) == 1
