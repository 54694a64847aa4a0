"""FusedAttention kernel on the GPU: every contract feature against the float64 numpy reference on fresh random
inputs (outputs poisoned with NaN first), the direct API's array kinds and its errors."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from _attention_cases import CASES, AttentionCase
from trt_fusedattn.plugins.attention.contract import fused_attention_reference

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

TOLERANCE = {"bfloat16": 1e-2, "float16": 2e-3}


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def assert_planted_row_zero(case, got: np.ndarray) -> None:
    """make_inputs plants query row 3 with every key masked: its output must be exactly zero."""
    if case.mask is not None and case.full_mask_shape()[-2] > 3:
        row = got[:, 3] if case.layout == "BSHD" else got[:, :, 3]
        assert not row.any()


def assert_matches_reference(case, inputs: dict, got: np.ndarray) -> None:
    """A kernel's output (host copy of a NaN-poisoned buffer) against the float64 reference: all written and finite,
    within the dtype's tolerance, the planted all-masked row zero."""
    assert np.isfinite(got).all(), "output has NaN/inf (unwritten or a masked row went NaN)"
    err = relative_error(got, reference(case, inputs))
    assert err <= TOLERANCE[case.dtype], f"relative Frobenius error {err:.2e} > {TOLERANCE[case.dtype]}"
    assert_planted_row_zero(case, got)


def make_inputs(case: AttentionCase, gen: torch.Generator) -> dict:
    """Fresh random device inputs for ``case``: q, k, v, and the mask / key lengths it asks for, with masked-out
    rows (every key masked) planted so the zero-row rule is exercised."""
    dtype = getattr(torch, case.dtype)
    q_shape, k_shape, v_shape = case.shapes()
    rand = lambda shape: torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32)  # noqa: E731
    inputs = {"q": rand(q_shape).to(dtype), "k": rand(k_shape).to(dtype), "v": rand(v_shape).to(dtype)}
    if case.mask is not None:
        shape = case.full_mask_shape()
        allowed = torch.rand(shape, generator=gen, device="cuda") > 0.3
        if shape[-2] > 3:
            allowed[..., 3, :] = False  # a query row with every key masked
        if case.mask == "bool":
            inputs["mask"] = allowed
        else:
            bias = 2 * rand(shape)
            inputs["mask"] = torch.where(allowed, bias, torch.full_like(bias, -float("inf"))).to(dtype)
    if case.key_lengths:
        lengths = torch.randint(1, case.len_kv + 1, (case.batch,), generator=gen, device="cuda", dtype=torch.int32)
        lengths[0] = 0 if case.batch > 1 else lengths[0]  # a batch with no keys at all
        inputs["key_lengths"] = lengths
    return inputs


def host(t) -> np.ndarray:
    t = t.detach().cpu()
    return (t if t.dtype in (torch.bool, torch.int32) else t.float()).numpy()


def reference(case: AttentionCase, inputs: dict) -> np.ndarray:
    """The float64 reference of ``case`` on the (host copies of the) device inputs."""
    return fused_attention_reference(*(host(inputs[n]) for n in ("q", "k", "v")),
                                     mask=host(inputs["mask"]) if "mask" in inputs else None,
                                     key_lengths=host(inputs["key_lengths"]) if "key_lengths" in inputs else None,
                                     **case.attrs())


@pytest.mark.parametrize("case", CASES, ids=[c.name + ("-small" if c.small else "") for c in CASES])
def test_matches_float64_reference(case):
    import trt_fusedattn
    gen = torch.Generator(device="cuda").manual_seed(hash(case.name) % 2**31)
    inputs = make_inputs(case, gen)
    out = torch.full(case.out_shape(), float("nan"), device="cuda", dtype=inputs["q"].dtype)  # poisoned
    result = trt_fusedattn.attention(inputs["q"], inputs["k"], inputs["v"], mask=inputs.get("mask"),
                                     key_lengths=inputs.get("key_lengths"), scale=case.scale, softcap=case.softcap,
                                     causal=case.causal, causal_alignment=case.alignment, layout=case.layout, out=out)
    assert result is out
    torch.cuda.synchronize()
    assert_matches_reference(case, inputs, host(out))


def test_allocates_output_with_vs_head_dim():
    """D_v != D_qk: the API allocates O with V's head dim and computes the contract (softcap too)."""
    import trt_fusedattn
    q, k = (torch.randn(2, 50, 4, 24, device="cuda", dtype=torch.float16) for _ in range(2))
    v = torch.randn(2, 50, 4, 40, device="cuda", dtype=torch.float16)
    out = trt_fusedattn.attention(q, k, v, softcap=1.5, scale=0.5)
    assert tuple(out.shape) == (2, 50, 4, 40)
    ref = fused_attention_reference(host(q), host(k), host(v), scale=0.5, softcap=1.5)
    assert relative_error(host(out), ref) <= TOLERANCE["float16"]


def test_allocates_output_and_uses_callers_stream():
    import trt_fusedattn
    q, k, v = (torch.randn(2, 65, 4, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        out = trt_fusedattn.attention(q, k, v, causal=True)
    stream.synchronize()
    assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == q.dtype
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2).double() for t in (q, k, v)),
                                                           is_causal=True).transpose(1, 2)
    assert relative_error(host(out), ref.cpu().numpy()) <= TOLERANCE["float16"]


def test_repeated_torch_calls_take_the_fast_path_with_the_same_checks():
    """Issue 10 item 3: a torch call seen before skips the array descriptions (api._torch_fast) but still computes
    the same attention, into out= or a new tensor, and still refuses a misaligned tensor of a known layout."""
    import trt_fusedattn
    from trt_fusedattn.launcher import ArrayError
    from trt_fusedattn.plugins.attention import api
    q, k, v = (torch.randn(2, 77, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    first = trt_fusedattn.attention(q, k, v, causal=True)
    entries = len(api._torch_fast)
    second = trt_fusedattn.attention(q, k, v, causal=1)  # the same key (True == 1)
    out = torch.full_like(q, float("nan"))
    third = trt_fusedattn.attention(q, k, v, causal=True, out=out)
    fourth = trt_fusedattn.attention(q, k, v, causal=True, out=out)
    torch.cuda.synchronize()
    assert len(api._torch_fast) == entries + 1 and third is out and fourth is out  # out= is one more key
    assert torch.equal(first, second) and torch.equal(first, out)
    base = torch.randn(q.numel() + 8, device="cuda", dtype=torch.bfloat16)
    shifted = base[1:1 + q.numel()].view(q.shape)  # q's layout, 2 bytes off alignment
    with pytest.raises(ArrayError, match="q starts at 0x[0-9a-f]+, not 16-byte aligned"):
        trt_fusedattn.attention(shifted, k, v, causal=True)


def test_cupy_arrays_give_cupy_output():
    cupy = pytest.importorskip("cupy")
    import trt_fusedattn
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 3, 50, 32)).astype(np.float16) for _ in range(3))
    out = trt_fusedattn.attention(*(cupy.asarray(x) for x in (q, k, v)), layout="BHSD")
    assert isinstance(out, cupy.ndarray)
    ref = fused_attention_reference(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), layout="BHSD")
    assert relative_error(cupy.asnumpy(out).astype(np.float32), ref) <= TOLERANCE["float16"]


@pytest.mark.parametrize("bad, message", [
    (dict(q=("float32",)), "float16 or bfloat16"),
    (dict(dim=600), "outside"),
    (dict(k_len=9, v_len=10), "K and V lengths"),
    (dict(host=True), "host array"),
    (dict(heads_kv=3), "multiple of key/value heads"),
])
def test_rejects_bad_arguments(bad, message):
    import trt_fusedattn
    dim = bad.get("dim", 64)
    dt = getattr(torch, bad.get("q", ("float16",))[0])
    device = "cpu" if bad.get("host") else "cuda"
    q = torch.randn(1, 8, 4, dim, device=device, dtype=dt)
    k = torch.randn(1, bad.get("k_len", 8), bad.get("heads_kv", 4), dim, device=device, dtype=torch.float16)
    v = torch.randn(1, bad.get("v_len", 8), bad.get("heads_kv", 4), dim, device=device, dtype=torch.float16)
    with pytest.raises(ValueError, match=message):
        trt_fusedattn.attention(q, k, v)


SAMPLES = Path(__file__).resolve().parents[1] / "models" / "samples"
ATTENTION_SAMPLES = sorted(p.stem for p in SAMPLES.glob("*.onnx")
                           if p.stem.split("_")[0] in ("bart", "bert", "gpt2", "llama", "vit"))


def gpu_fused_attention(q, k, v, mask=None, key_lengths=None, **attrs):
    """A FusedAttention node evaluated by our kernel: numpy in, float16 on the GPU (bfloat16 kept), numpy out."""
    import trt_fusedattn
    dtype = torch.float16
    dev = lambda a, dt=dtype: torch.from_numpy(np.ascontiguousarray(a)).to("cuda", dt)  # noqa: E731
    m = None if mask is None else dev(mask, torch.bool if mask.dtype == bool else dtype)
    lengths = None if key_lengths is None else dev(key_lengths, torch.int32)
    out = trt_fusedattn.attention(dev(q), dev(k), dev(v), mask=m, key_lengths=lengths, **attrs)
    return out.float().cpu().numpy().astype(q.dtype)


@pytest.mark.parametrize("sample", ATTENTION_SAMPLES)
def test_fused_sample_models_match_the_originals(sample):
    pytest.importorskip("onnxruntime_extensions")
    import trt_fusedattn
    from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
    from trt_fusedattn.verification import verify
    path = SAMPLES / f"{sample}.onnx"
    fused, _ = trt_fusedattn.fuse(str(path))
    nodes = sum(n.op_type == "FusedAttention" for n in fused.graph.node)
    assert nodes > 0, f"{sample}: no FusedAttention node after fusion"
    calls = []
    counted = lambda *a, **k: calls.append(1) or gpu_fused_attention(*a, **k)  # noqa: E731
    result = verify(str(path), fused, seed=random.SystemRandom().randrange(2 ** 31), rtol=2e-2,
                    implementations={FUSED_ATTENTION: counted})
    assert len(calls) == nodes
    assert result.passed, result.table()
