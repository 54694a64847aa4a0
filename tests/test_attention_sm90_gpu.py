"""FusedAttention's Hopper wgmma mainloop (plan tuning WGMMA=1, sm_90a) and warp-specialized kernel
(WARP_SPECIALIZED=1) and the cluster key split (KV_SPLIT) on the GPU: every feature case of ``WGMMA_CASES``,
``WARP_SPECIALIZED_CASES`` and ``SPLIT_KV_CASES`` against the float64 numpy reference on fresh random inputs (outputs poisoned with NaN first),
launched through the plan exactly as a TensorRT engine would, plus the API on the plan's default path."""
from __future__ import annotations

import numpy as np
import pytest

from _attention_cases import SPLIT_KV_CASES, WARP_SPECIALIZED_CASES, WGMMA_CASES
from test_attention_gpu import TOLERANCE, assert_planted_row_zero, host, make_inputs, reference, relative_error

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


HOPPER_CASES = WGMMA_CASES + WARP_SPECIALIZED_CASES + SPLIT_KV_CASES


@pytest.fixture(scope="module", autouse=True)
def hopper_with_kernels_loaded(request):
    """Skip off sm_90a; compile and load (driver JIT) the selected cases' kernels up front, in parallel: one by one,
    at first launch, the ~80 specializations would take minutes (with -k, e.g. under compute-sanitizer, only those)."""
    from trt_fusedattn.launcher import device_arch
    from trt_fusedattn.launcher.launch import precompile
    arch = device_arch(0)
    if arch != "sm_90a":
        pytest.skip(f"the wgmma mainloop needs an sm_90a GPU (Hopper); this one is {arch}")
    params = [getattr(getattr(item, "callspec", None), "params", {}) for item in request.session.items]
    selected = [p["case"] for p in params if p.get("case") in HOPPER_CASES]
    precompile([c.plan(arch) for c in selected or HOPPER_CASES], arch)


def error_pattern(got: np.ndarray, ref: np.ndarray, layout: str) -> str:
    """Where the wrong outputs sit, to tell layout bugs apart in one run: by 16-row warp slot of a 128-row block
    (slots 4-7 = second warpgroup), by 8-column chunk of the head dim (a swizzle or descriptor offset shows as a
    chunk pattern, columns >= 64 as the second column block), and by query block."""
    if layout == "BHSD":
        got, ref = got.transpose(0, 2, 1, 3), ref.transpose(0, 2, 1, 3)
    bad = np.abs(got - ref) > 0.05 * max(float(np.sqrt(np.mean(ref ** 2))), 1e-6)  # [B, L, H, D]
    rows, cols = bad.any(axis=(0, 2, 3)), bad.any(axis=(0, 1, 2))
    idx = np.nonzero(rows)[0]
    warp_slots = np.bincount((idx % 128) // 16, minlength=8).tolist()
    chunks = [int(c) for c in np.nonzero(np.add.reduceat(cols, np.arange(0, cols.size, 8)))[0]]
    blocks = sorted(set((idx // 128).tolist()))[:8]
    return (f"{bad.mean():.1%} of outputs off; bad query rows {idx.size}/{rows.size} by warp slot {warp_slots}; "
            f"bad head-dim chunks {chunks}; first bad query blocks {blocks}")


@pytest.mark.parametrize("case", HOPPER_CASES, ids=[c.name + ("-small" if c.small else "") for c in HOPPER_CASES])
def test_wgmma_matches_float64_reference(case):
    from trt_fusedattn.launcher import launch
    plan = case.plan("sm_90a")
    assert dict(case.tuning).items() <= plan.defines.items()  # the variant asked for is the one launched
    gen = torch.Generator(device="cuda").manual_seed(hash(case.name) % 2**31)
    inputs = make_inputs(case, gen)
    out = torch.full_like(inputs["q"], float("nan"))  # poisoned: every element must be written
    pointers = [inputs[n].data_ptr() if n in inputs else None for n in ("q", "k", "v", "mask", "key_lengths")]
    launch(plan, "sm_90a", pointers, [out.data_ptr()], stream=torch.cuda.current_stream().cuda_stream, device=0)
    torch.cuda.synchronize()
    got = host(out)
    ref = reference(case, inputs)
    finite = np.isfinite(got)
    assert finite.all(), (f"output has NaN/inf (unwritten or a masked row went NaN): "
                          f"{error_pattern(np.where(finite, got, 1e30), ref, case.layout)}")
    err = relative_error(got, ref)
    assert err <= TOLERANCE[case.dtype], (f"relative Frobenius error {err:.2e} > {TOLERANCE[case.dtype]}: "
                                          f"{error_pattern(got, ref, case.layout)}")
    assert_planted_row_zero(case, got)


@pytest.mark.parametrize("dim", [64, 128])
def test_api_default_path_agrees_with_wgmma(dim):
    """The API (whatever path WGMMA_BY_DEFAULT picks) and the forced wgmma path give the same attention."""
    import trt_fusedattn
    from trt_fusedattn.launcher import launch
    from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
    from trt_fusedattn.plugins.attention.plan import plan_attention
    q, k, v = (torch.randn(2, 333, 4, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    api_out = trt_fusedattn.attention(q, k, v, causal=True)
    plan = plan_attention([tuple(q.shape)] * 3 + [None, None], ["bfloat16"] * 3 + [None, None],
                          FUSED_ATTENTION.resolve({"causal": 1}), "sm_90a", tuning={"WGMMA": 1})
    out = torch.full_like(q, float("nan"))
    launch(plan, "sm_90a", [q.data_ptr(), k.data_ptr(), v.data_ptr(), None, None], [out.data_ptr()],
           stream=torch.cuda.current_stream().cuda_stream, device=0)
    torch.cuda.synchronize()
    assert relative_error(host(out), host(api_out)) <= TOLERANCE["bfloat16"]
