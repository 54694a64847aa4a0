"""FusedConv kernels compile (CPU, local nvcc): every specialization the GPU tests launch, for sm_80, sm_89 and
sm_90a (FP8 ones for sm_89 and sm_90a), with no register spills; the PTX holds the tensor-core, ldmatrix and cp.async
instructions meant, and the SASS the FP8 tensor-core op (QMMA on sm_89; on sm_90a ptxas lowers mma.sync e4m3 to
fp16 HMMA: Hopper's FP8 rate is wgmma-only)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import pytest

from _conv_cases import CASES, DEPTHWISE_CHUNK_PLANS, FP8_CASES, WGMMA_CASES, WS_CASES, X_E4M3_CASES
from _fp8_chain_cases import PRODUCER_CASES
from trt_fusedattn.launcher import compile as comp

try:
    comp.nvcc_path()
    HAVE_NVCC = True
except comp.CompileError:
    HAVE_NVCC = False

pytestmark = pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not found (CUDA toolkit)")


def _specializations(arch: str) -> dict:
    """(source, defines) -> one case name using it."""
    specs = {}
    plans = [(c, c.plan(arch)) for c in CASES]
    plans += [(c, c.plan(arch, mma=m)) for c in FP8_CASES for m in ("mma.sync", "wgmma") if arch != "sm_80"]
    plans += [(c, c.plan(arch)) for c in X_E4M3_CASES if arch != "sm_80"]
    plans += [(t, t.plan(arch)) for t in WGMMA_CASES + WS_CASES if arch == "sm_90a"]
    plans += [(p, p.plan(arch, mma=m)) for p in PRODUCER_CASES for m in ("mma.sync", "wgmma") if arch != "sm_80"]
    for case, plan in plans:
        specs.setdefault((plan.source, tuple(sorted(plan.defines.items()))), case.name)
    return specs


def test_the_four_block_tap_row_kernels_compile_without_spills(monkeypatch):
    """The tap-row cases with registers capped for 4 blocks per SM and 3 stages (the b32 stem's plan on sm_90a; the
    test cases' own grids take 3): 128 registers at most, no spills."""
    from trt_fusedattn.plugins.conv import plan as conv_plan
    monkeypatch.setattr(conv_plan, "TAP_ROWS_WAVE_COST", {4: 1.0})
    for case in (c for c in CASES if "stem" in c.name or "tap_rows" in c.name):
        plan = case.plan("sm_90a")
        assert (plan.defines["TAP_ROWS_BLOCKS"], plan.defines["STAGES"]) == (4, 3), case.name
        report = comp.compile_cubin(plan.source, "sm_90a", plan.defines)[1]
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
        assert spills and not any(spills), f"{case.name} spills at 4 blocks per SM: {report}"


def test_depthwise_threads_of_several_pixels_compile_without_spills(monkeypatch):
    """The depthwise cases at 2 and 4 pixels a thread (DW_PIX) and the chunk-count plans, as test_conv_gpu runs them: no
    spills on sm_90a."""
    from trt_fusedattn.plugins.conv import plan as conv_plan
    monkeypatch.setattr(conv_plan, "DW_WHOLE_PIXEL_BYTES", 0)  # as test_conv_gpu: the pixel count alone
    for pixels in (2, 4):
        monkeypatch.setattr(conv_plan, "depthwise_pixels", lambda tile, geo, n_p_q: pixels)
        for case in (c for c in CASES if c.groups == c.c > 1 and not c.name.startswith("dw_act")):
            plan = case.plan("sm_90a")
            report = comp.compile_cubin(plan.source, "sm_90a", plan.defines)[1]
            spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
            assert spills and not any(spills), f"{case.name} at {pixels} pixels a thread spills: {report}"
    for case, overrides in DEPTHWISE_CHUNK_PLANS:  # chunk counts that need not divide 256
        plan = case.plan("sm_90a", **overrides)
        report = comp.compile_cubin(plan.source, "sm_90a", plan.defines)[1]
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
        assert spills and not any(spills), f"{case.name} with {overrides} spills: {report}"


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90a"])
def test_every_tested_specialization_compiles_without_spills(arch):
    specs = _specializations(arch)
    compile_one = lambda spec: comp.compile_cubin(spec[0], arch, dict(spec[1]))[1]  # noqa: E731
    with ThreadPoolExecutor(max_workers=2) as pool:
        reports = dict(zip(specs.values(), pool.map(compile_one, specs)))
    for name, report in reports.items():
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
        assert spills and not any(spills), f"{name} on {arch} spills registers: {report}"


def test_ptx_uses_tensor_cores_ldmatrix_and_cp_async():
    case = next(c for c in CASES if c.name == "3x3_c64_k64_17x13")
    plan = case.plan("sm_90a", mma="mma.sync")
    ptx = comp.compile_ptx(plan.source, "sm_90a", plan.defines)
    for instruction in ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "ldmatrix.sync.aligned.m8n8.x4",
                        "cp.async.cg.shared.global"):
        assert instruction in ptx, f"{instruction} missing from the implicit-GEMM PTX"
    plan = case.plan("sm_90a")  # Hopper's default: wgmma from the same swizzled tiles
    ptx = comp.compile_ptx(plan.source, "sm_90a", plan.defines)
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in ptx and "cp.async.cg.shared.global" in ptx


def _cuobjdump() -> str | None:
    """cuobjdump from PATH or next to nvcc (None when the toolkit ships without it)."""
    found = shutil.which("cuobjdump")
    beside = Path(comp.nvcc_path()).resolve().parent / "cuobjdump"
    return found or (str(beside) if beside.is_file() else None)


@pytest.mark.parametrize("arch, mma, ptx_mma, sass_mma", [
    ("sm_89", "mma.sync", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "QMMA.16832.F32.E4M3.E4M3"),
    ("sm_90a", "mma.sync", "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "HMMA.16816.F32"),
    ("sm_90a", "wgmma", "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3", "QGMMA.64x64x32.F32.E4M3.E4M3"),
])
def test_fp8_specialization_runs_e4m3_mma(arch, mma, ptx_mma, sass_mma):
    plan = next(c for c in FP8_CASES if c.name == "fp8_3x3_c64_k64_17x13").plan(arch, mma=mma)
    ptx = comp.compile_ptx(plan.source, arch, plan.defines)
    assert ptx_mma in ptx
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx  # X quantized in the kernel
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (CUDA toolkit without it): SASS not checked")
    cubin, _ = comp.compile_cubin(plan.source, arch, plan.defines)
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert sass_mma in sass, f"{sass_mma} missing from the {arch} SASS"


def _tuned(name: str):
    return next(t for t in WGMMA_CASES if t.name == name)


@pytest.mark.parametrize("tuned", WGMMA_CASES, ids=lambda t: t.name)
def test_wgmma_variant_ptx(tuned):
    """Each forced sm_90a variant: warpgroup MMAs of BLOCK_N columns in its operand type (no mma.sync left), a
    compile-time cluster shape with DSMEM stores (the cluster sum's pushes) exactly when CLUSTER_K is set, A through
    L1 exactly under TAPS_INNER."""
    plan = tuned.plan("sm_90a")
    d = plan.defines
    ptx = comp.compile_ptx(plan.source, "sm_90a", d)
    operand = "k32.f32.e4m3.e4m3" if d.get("FP8") else ("k16.f32.bf16.bf16" if d["DTYPE_BF16"] else "k16.f32.f16.f16")
    assert f"wgmma.mma_async.sync.aligned.m64n{d['BLOCK_N']}{operand}" in ptx
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+)k", ptx))
    assert shapes == {f"m64n{d['BLOCK_N']}"}, shapes
    assert "mma.sync" not in ptx and "wgmma.wait_group.sync.aligned 1" in ptx
    cluster = d.get("CLUSTER_K", 1)
    for instruction in (".reqnctapercluster", "mapa.shared::cluster", "st.shared::cluster.v4.f32",
                        "barrier.cluster.arrive.release.aligned"):
        assert (instruction in ptx) == (cluster > 1), instruction
    if cluster > 1:
        assert f".reqnctapercluster 1, 1, {cluster}" in ptx
    # cluster sums past the ring: arrived on at kernel start, one release barrier after the pushes (else two)
    assert ("barrier.cluster.arrive.relaxed" in ptx) == ("PUSHED_OFFSET" in d)
    if cluster > 1:
        assert ptx.count("barrier.cluster.arrive.release") == (1 if "PUSHED_OFFSET" in d else 2)
    assert ("cp.async.ca.shared.global" in ptx) == bool(d.get("TAPS_INNER"))
    assert "cp.async.cg.shared.global" in ptx  # W (and A without TAPS_INNER) through L2 only


@pytest.mark.parametrize("name, instructions", [
    ("wg_3x3_c64_k96_b1__128x128w8", ["wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16"]),
    ("wg_3x3_c64_k64__128x128w8_cluster2", [".reqnctapercluster 1, 1, 2", "mapa.shared::cluster.u32"]),
    ("wg_3x3_c128_k64_ti__128x64w4_taps_inner", ["cp.async.ca.shared.global",
                                                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"]),
])
def test_wgmma_cluster_and_taps_inner_ptx_instructions(name, instructions):
    plan = _tuned(name).plan("sm_90a")
    ptx = comp.compile_ptx(plan.source, "sm_90a", plan.defines)
    for instruction in instructions:
        assert instruction in ptx, f"{instruction} missing from {name}'s PTX"


@pytest.mark.parametrize("name, sass_mma", [
    ("wg_3x3_c64_k96_b1__128x128w8", "HGMMA.64x128x16.F32"),
    ("wg_1x1_c128_k320_bf16__128x256w8", "HGMMA.64x256x16.F32.BF16"),
    ("wg_fp8_3x3_c64_k96__128x128w8", "QGMMA.64x128x32.F32.E4M3.E4M3"),
])
def test_wgmma_variant_sass_runs_warpgroup_mma(name, sass_mma):
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (CUDA toolkit without it): SASS not checked")
    plan = _tuned(name).plan("sm_90a")
    cubin, _ = comp.compile_cubin(plan.source, "sm_90a", plan.defines)
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert sass_mma in sass, f"{sass_mma} missing from {name}'s SASS"
    assert "HMMA.16816" not in sass  # no mma.sync left


@pytest.mark.parametrize("tuned", WS_CASES, ids=lambda t: t.name)
def test_warp_specialized_kernel_ptx(tuned):
    """The warp-specialized kernel: its own entry point, register hand-over between the roles (setmaxnreg; none with
    two blocks per SM, three MMA warpgroups, whose 512 threads keep 128 each, or one, whose 256 keep 255), the ring's
    mbarrier hand-offs, cp.async loads, warpgroup MMAs of BLOCK_N columns with one tile in flight, the cluster shape
    exactly when CLUSTER_K is set; no mma.sync; no ptxas warning (C7508: setmaxnreg ignored) and no serialized wgmma
    (C7513/C7514/C7517: ptxas reports them as info)."""
    plan = tuned.plan("sm_90a")
    d = plan.defines
    mma_warps = d["WARPS_M"] * d["WARPS_N"]
    assert plan.kernel == "fused_conv_implicit_gemm_sm90" and d["WARP_SPECIALIZED"] == 1
    assert plan.block == (128 + 32 * mma_warps, 1, 1) and mma_warps in (4, 8, 12)
    ptx = comp.compile_ptx(plan.source, "sm_90a", d)
    operand = "k32.f32.e4m3.e4m3" if d.get("FP8") else "k16.f32.bf16.bf16" if d["DTYPE_BF16"] else "k16.f32.f16.f16"
    for instruction in ("mbarrier.try_wait.parity.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
                        "cp.async.mbarrier.arrive.noinc.shared::cta.b64",
                        "cp.async.cg.shared.global", "fence.proxy.async.shared::cta",
                        f"wgmma.mma_async.sync.aligned.m64n{d['BLOCK_N']}{operand}", "wgmma.wait_group.sync.aligned 1"):
        assert instruction in ptx, f"{instruction} missing from {tuned.name}'s PTX"
    assert "mma.sync" not in ptx
    assert (".reqnctapercluster" in ptx) == ("CLUSTER_K" in d or "SHARE_W" in d)
    assert ("barrier.cluster.wait" in ptx) == ("CLUSTER_K" in d or "SHARE_W" in d)
    # cluster sums past the ring: arrived on at kernel start, one release barrier after the pushes (else two)
    assert ("barrier.cluster.arrive.relaxed" in ptx) == ("PUSHED_OFFSET" in d)
    if "CLUSTER_K" in d:  # the MMA and the load warpgroups' paths
        assert ptx.count("barrier.cluster.arrive.release") == (2 if "PUSHED_OFFSET" in d else 4)
    for instruction in ("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32", "mbarrier.expect_tx",
                        "mbarrier.arrive.shared::cluster.b64", "fence.mbarrier_init.release.cluster"):
        assert (instruction in ptx) == ("SHARE_W" in d), f"{instruction} in {tuned.name}'s PTX"
    one_block = d.get("WS_CTAS", 1) == 1 and mma_warps == 8  # else every role keeps the registers it starts with
    for instruction in ("setmaxnreg.dec.sync.aligned.u32", "setmaxnreg.inc.sync.aligned.u32"):
        assert (instruction in ptx) == one_block, instruction
    assert f".minnctapersm {d.get('WS_CTAS', 1)}" in ptx
    _, report = comp.compile_cubin(plan.source, "sm_90a", d)
    assert "warning" not in report.lower() and "serialized" not in report, report


@pytest.mark.parametrize("name", ["3x3_c256_k256_ws__128x256w8", "3x3_c256_k128_b1_ws__128x128w8_cluster2",
                                  "3x3_c128_k192_share_ws__128x128w8_share_w"])
def test_warp_specialized_kernel_sass(name):
    """SASS of the warp-specialized kernel: HGMMA of the tile width, the register hand-over, no local memory;
    share_w: the W-half pushes as STAS.128 and no GPU-wide memory barrier in the MMA loop's stage release."""
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (CUDA toolkit without it): SASS not checked")
    plan = next(t for t in WS_CASES if t.name == name).plan("sm_90a")
    cubin, _ = comp.compile_cubin(plan.source, "sm_90a", plan.defines)
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    assert f"HGMMA.64x{plan.defines['BLOCK_N']}x16.F32" in sass
    assert "USETMAXREG.DEALLOC" in sass and "USETMAXREG.TRY_ALLOC" in sass
    assert not re.search(r"\b(LDL|STL)\b", sass), "local memory (spills) in the SASS"
    if plan.defines.get("SHARE_W"):
        assert "STAS.128" in sass
        # the cluster barriers at start and end fence GPU-wide; the releases between them must not
        assert sass.count("MEMBAR.ALL.GPU") == sass.count("UCGABAR_ARV")
