"""The direct API's argument handling on the CPU (no GPU: the device's arch is given, the launch is not prepared):
the FP8 attributes (issue 11 item 3) reach the contract's checks and the plan, the output is allocated in the
contract's output dtype, and what is wrong fails in one line before anything touches a device."""
from __future__ import annotations

import pytest

from trt_fusedattn.launcher import ArrayError
from trt_fusedattn.plugins.attention import api

SHAPE = ((2, 3, 8, 64), (3 * 8 * 64, 8 * 64, 64, 1), "bfloat16", 0)  # (shape, strides, dtype, device): BSHD, dense
KV = ((2, 40, 2, 64), (40 * 2 * 64, 2 * 64, 64, 1), "bfloat16", 0)


def _attrs(**given):
    """The API's attribute tuple (contract order) with the contract's defaults."""
    defaults = {"layout": "BSHD", "scale": 0.0, "softcap": 0.0, "causal": 0, "causal_alignment": "top_left",
                "q_scale": 0.0, "k_scale": 0.0, "v_scale": 0.0, "p_scale": 0.0, "output_dtype": "auto",
                "output_scale": 0.0}
    return tuple({**defaults, **given}[name] for name in api.ATTRIBUTES)


@pytest.fixture
def prepare(monkeypatch):
    """api._prepared (uncached) on an sm_90a stand-in arch, recording what reaches the plan; no launch is built."""
    seen = {}

    def plan(shapes, dtypes, attrs, arch):
        seen.update(shapes=shapes, dtypes=dtypes, attrs=attrs, arch=arch)
        return "plan"
    monkeypatch.setattr(api, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(api, "plan_attention", plan)
    monkeypatch.setattr(api, "PreparedLaunch", lambda plan, arch, n_in, n_out, device: ("launch", plan, n_in))

    def run(dtype="bfloat16", kv_dtype=None, **attrs):
        q = (SHAPE[0], SHAPE[1], dtype, 0)
        k = (KV[0], KV[1], kv_dtype or dtype, 0)
        return api._prepared.__wrapped__((q, k, k, None, None), _attrs(**attrs)), seen
    return run


def test_fp8_attributes_reach_the_plan_and_choose_the_output_dtype(prepare):
    fp8 = dict(q_scale=0.5, k_scale=0.25, v_scale=2.0, p_scale=0.01)
    prepared, seen = prepare("float8_e4m3fn", **fp8)
    assert prepared.out_dtype == "float16" and prepared.out_shape == (2, 3, 8, 64)  # auto: float16 for FP8 Q
    assert {k: seen["attrs"][k] for k in fp8} == fp8 and seen["dtypes"][:3] == ["float8_e4m3fn"] * 3
    assert prepare("float8_e4m3fn", output_dtype="bfloat16", **fp8)[0].out_dtype == "bfloat16"
    prepared, seen = prepare("float8_e4m3fn", output_dtype="float8e4m3fn", output_scale=0.1, **fp8)
    assert prepared.out_dtype == "float8_e4m3fn" and seen["attrs"]["output_scale"] == 0.1
    assert prepare("bfloat16", output_dtype="bfloat16")[0].out_dtype == "bfloat16"


@pytest.mark.parametrize("dtype, kv_dtype, attrs, message", [
    ("bfloat16", None, dict(q_scale=0.5), "q_scale"),
    ("bfloat16", None, dict(output_dtype="float16"), "output_dtype"),
    ("float8_e4m3fn", "bfloat16", dict(q_scale=1.0, k_scale=1.0, v_scale=1.0), "all float8e4m3fn or none"),
    ("float8_e4m3fn", None, dict(q_scale=1.0, k_scale=1.0), "v_scale"),
    ("float8_e4m3fn", None, dict(q_scale=1.0, k_scale=1.0, v_scale=1.0, output_dtype="float8e4m3fn"),
     "output_scale"),
])
def test_fp8_attribute_errors_are_one_line(prepare, dtype, kv_dtype, attrs, message):
    with pytest.raises(ValueError, match=message) as info:
        prepare(dtype, kv_dtype, **attrs)
    assert "\n" not in str(info.value)


def test_host_tensors_rejected_before_any_device_work():
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 2, 4, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(ArrayError, match="q is a host array"):
        api.attention(q, q, q, q_scale=1.0, k_scale=1.0, v_scale=1.0)
    assert not api._torch_fast  # nothing unchecked is remembered by the fast path
