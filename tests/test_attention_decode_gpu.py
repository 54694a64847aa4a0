"""FusedAttention decode on the GPU: GQA packing (a K/V head's query heads in one tile) with and without the cluster
key split, every case of ``DECODE_CASES`` against the float64 numpy reference on fresh random inputs (outputs poisoned
with NaN first), launched through the plan as a TensorRT engine would; and the direct API on a packed decode shape."""
from __future__ import annotations

import pytest

from _attention_decode_cases import DECODE_CASES
from test_attention_gpu import TOLERANCE, assert_matches_reference, host, make_inputs, relative_error

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def arch(request):
    """The device's arch, with the selected cases' kernels compiled and loaded up front in parallel threads (under
    compute-sanitizer with -k, only those)."""
    from trt_fusedattn.launcher import device_arch
    from trt_fusedattn.launcher.launch import precompile
    arch = device_arch(0)
    params = [getattr(getattr(item, "callspec", None), "params", {}) for item in request.session.items]
    selected = [p["case"] for p in params if p.get("case") in DECODE_CASES]
    precompile([c.plan(arch) for c in selected or DECODE_CASES if _runs_on(c, arch)], arch)
    return arch


def _runs_on(case, arch: str) -> bool:
    """Forced cluster splits need sm_90 (thread-block clusters); everything else runs on any GPU of ours."""
    return arch.startswith("sm_9") or dict(case.tuning).get("KV_SPLIT", 1) == 1


@pytest.mark.parametrize("case", DECODE_CASES, ids=[c.name + ("-small" if c.small else "") for c in DECODE_CASES])
def test_decode_matches_float64_reference(case, arch):
    from trt_fusedattn.launcher import launch
    if not _runs_on(case, arch):
        pytest.skip(f"{case.name} forces a cluster split, which needs sm_90 or newer (this GPU: {arch})")
    plan = case.plan(arch)
    assert dict(case.tuning).items() <= plan.defines.items()
    if not case.tuning:  # the default plan packs every group of query heads of these decode shapes (single-role)
        assert plan.defines["PACK_GQA"] == case.heads_q // case.heads_kv and plan.source.name == "attention.cu"
    gen = torch.Generator(device="cuda").manual_seed(hash(case.name) % 2**31)
    inputs = make_inputs(case, gen)
    out = torch.full(case.out_shape(), float("nan"), device="cuda", dtype=inputs["q"].dtype)  # poisoned
    pointers = [inputs[n].data_ptr() if n in inputs else None for n in ("q", "k", "v", "mask", "key_lengths")]
    launch(plan, arch, pointers, [out.data_ptr()], stream=torch.cuda.current_stream().cuda_stream, device=0)
    torch.cuda.synchronize()
    got = host(out)
    assert_matches_reference(case, inputs, got)
    if case.key_lengths and case.batch > 1:  # make_inputs gives batch 0 no keys: its outputs are exactly zero
        assert not got[0].any()


def test_api_packs_decode_and_agrees_with_the_unpacked_kernel(arch):
    """trt_fusedattn.attention on a Llama-3 decode shape (the plan packs and splits) against the general tiles."""
    import trt_fusedattn
    from trt_fusedattn.launcher import launch
    from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
    from trt_fusedattn.plugins.attention.plan import plan_attention
    q = torch.randn(2, 3, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 5000, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    api_out = trt_fusedattn.attention(q, k, v, causal=True, causal_alignment="bottom_right")
    attrs = FUSED_ATTENTION.resolve({"causal": 1, "causal_alignment": "bottom_right"})
    shapes, dtypes = [tuple(q.shape), tuple(k.shape), tuple(v.shape), None, None], ["bfloat16"] * 3 + [None, None]
    assert plan_attention(shapes, dtypes, attrs, arch).defines["PACK_GQA"] == 4
    plan = plan_attention(shapes, dtypes, attrs, arch, tuning={"WGMMA": 0, "PACK_GQA": 1})
    out = torch.full_like(q, float("nan"))
    launch(plan, arch, [q.data_ptr(), k.data_ptr(), v.data_ptr(), None, None], [out.data_ptr()],
           stream=torch.cuda.current_stream().cuda_stream, device=0)
    torch.cuda.synchronize()
    assert relative_error(host(api_out), host(out)) <= TOLERANCE["bfloat16"]
