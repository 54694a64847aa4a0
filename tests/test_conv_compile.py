"""FusedConv kernels compile (CPU, local nvcc): every specialization the GPU tests launch, for sm_80, sm_89 and
sm_90a, with no register spills; the PTX holds the tensor-core, ldmatrix and cp.async instructions meant."""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from _conv_cases import CASES
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
    for case in CASES:
        plan = case.plan(arch)
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
    plan = next(c for c in CASES if c.name == "3x3_c64_k64_17x13").plan("sm_90a")
    ptx = comp.compile_ptx(plan.source, "sm_90a", plan.defines)
    for instruction in ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "ldmatrix.sync.aligned.m8n8.x4",
                        "cp.async.cg.shared.global"):
        assert instruction in ptx, f"{instruction} missing from the implicit-GEMM PTX"
