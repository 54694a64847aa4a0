"""The GPU facts (trt_fusedattn/launcher/arch.py) as both launch plans use them: an arch missing from the table plans
within the smallest shared memory listed, so any listed GPU could run what it planned; arches alike in every fact
(limit, no wgmma, no clusters) plan the same float16/bfloat16 kernels."""
from __future__ import annotations

import pytest

from _attention_cases import CASES as ATTENTION_CASES
from _conv_cases import CASES as CONV_CASES
from trt_fusedattn.launcher.arch import SHARED_LIMIT, arch_number, shared_limit

UNLISTED = ("sm_121", "sm_200a")


@pytest.mark.parametrize("arch", UNLISTED)
def test_unlisted_arch_plans_fit_the_smallest_listed_gpu(arch):
    assert arch not in SHARED_LIMIT
    smallest = min(SHARED_LIMIT.values())
    for case in [*ATTENTION_CASES, *CONV_CASES]:
        plan = case.plan(arch)
        assert plan.shared_mem <= smallest, f"{case.name} on {arch}: {plan.shared_mem} B"


def test_arches_alike_in_every_fact_plan_the_same_kernels():
    assert shared_limit("sm_86") == shared_limit("sm_89") and max(arch_number("sm_86"), arch_number("sm_89")) < 90
    for case in [*ATTENTION_CASES, *CONV_CASES]:
        assert case.plan("sm_86").defines == case.plan("sm_89").defines, case.name


def test_arch_number_reads_the_digits():
    assert [arch_number(a) for a in ("sm_80", "sm_89", "sm_90a", "sm_100f", "sm_120a", "gfx90a")] == [
        80, 89, 90, 100, 120, 0]
