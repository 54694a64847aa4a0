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

from _conv_cases import CASES, FP8_CASES, WGMMA_CASES, X_E4M3_CASES
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
    plans += [(t, t.plan(arch)) for t in WGMMA_CASES if arch == "sm_90a"]
    for case, plan in plans:
        specs.setdefault((plan.source, tuple(sorted(plan.defines.items()))), case.name)
    return specs


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
