"""FP8-fused sample models run with our FP8 FusedConv kernels (sm_89+) and FP8 FusedAttention kernel (sm_90a) for
their custom nodes: the kernels match the numpy reference's FP8 emulation, and the error against the original float
model is reported.

The fused models come from the CPU path (calibration on random inputs, and Model Optimizer-style Q/DQ); each
FusedConv node runs the kernel through ``verify(implementations=...)``: X in float16 (what the TensorRT layer's
Casts give a float32 model under --fp8), W float8_e4m3fn, its per-channel scale and input_scale as the node has
them. Two comparisons per model: node by node, the kernel against the reference on the same float16 inputs (those
of a run of the fused model by the references: FP8 emulated exactly as the kernel quantizes), and the whole model
on the kernels against the original (FP8's own error, under FP8_RTOL). Whole-model kernel-vs-emulation is not a
bound: a deep FP8 stack amplifies one e4m3 rounding that fp32 and float64 place on different sides of a tie."""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest

from trt_fusedattn.plugins.conv.contract import FUSED_CONV

from _fp8_chain_cases import e4m3_mismatch
from _fp8_models import CONV_SAMPLES, FP8_ATTENTION_SAMPLES, conv_qdq_version, matmul_qdq_version, sample

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

KERNEL_VS_EMULATION = 2e-3  # normwise, per node (test_conv_gpu's float16 bound): fp32 accumulation order and
                            # float16 output rounding; an X element within 2^-20 of an e4m3 tie may round the
                            # other way (the kernel multiplies by 1/input_scale in fp32)


def _channels_last(t):
    return t.contiguous(memory_format=torch.channels_last)


def gpu_fused_conv(x, w, shift=None, scale=None, residual=None, **attrs):
    """A 2-D FusedConv node on our kernel: float16 X (and residual), W float8_e4m3fn with input_scale (FP8) or
    float16; numpy in and out in the node's dtypes."""
    import trt_fusedattn

    fp8 = bool(attrs["input_scale"])
    dev = lambda a, dtype=torch.half: None if a is None else torch.from_numpy(  # noqa: E731
        np.ascontiguousarray(np.asarray(a, np.float32))).to("cuda", dtype)
    e4m3 = lambda a: dev(a, torch.float32).to(torch.float8_e4m3fn)  # noqa: E731  (exact: a holds e4m3 values)
    wt = (e4m3(w) if fp8 else dev(w)).permute(0, 3, 1, 2)
    xt = e4m3(x) if x.dtype == ml_dtypes.float8_e4m3fn else dev(x)
    y = trt_fusedattn.conv2d(_channels_last(xt), wt, dev(shift, torch.float32), scale=dev(scale, torch.float32),
                             stride=tuple(attrs["strides"]) or 1, padding=tuple(attrs["pads"]) or 0,
                             dilation=tuple(attrs["dilations"]) or 1, groups=attrs["group"],
                             activation=attrs["activation"], activation_alpha=attrs["activation_alpha"],
                             activation_beta=attrs["activation_beta"],
                             residual=None if residual is None else _channels_last(dev(residual)),
                             post_activation=attrs["post_activation"],
                             post_activation_alpha=attrs["post_activation_alpha"],
                             post_activation_beta=attrs["post_activation_beta"], input_scale=attrs["input_scale"],
                             output_scale=attrs["output_scale"])
    if attrs["output_scale"]:  # an FP8 chain's producer: e4m3 bytes, as the reference gives them
        return y.float().cpu().numpy().astype(ml_dtypes.float8_e4m3fn)
    return y.float().cpu().numpy().astype(np.float16 if x.dtype == ml_dtypes.float8_e4m3fn else x.dtype)


def float16_reference(x, *args, **attrs):
    """The node's reference on float16 X and residual (what the kernel is given; e4m3 X as it is), its output in
    the node's output dtype."""
    x16 = np.asarray(x) if np.asarray(x).dtype == ml_dtypes.float8_e4m3fn else np.asarray(x).astype(np.float16)
    args = list(args)
    if len(args) > 3 and args[3] is not None:
        args[3] = np.asarray(args[3]).astype(np.float16)
    y = FUSED_CONV.reference(x16, *args, **attrs)
    return y if x16 is x or attrs["output_scale"] else y.astype(np.asarray(x).dtype)


def _fused_models(name):
    from trt_fusedattn.pipeline import fuse

    model = sample(name)
    yield "calibrated", model, fuse(model, precision="fp8", calibration="random:8")[0]
    yield "Q/DQ", model, fuse(conv_qdq_version(model))[0]
    if name == "resnet_dynamo":  # and Model Optimizer's float16 export: e4m3 X from its QuantizeLinears
        exported = onnx.load(Path(__file__).parent / "data" / "resnet_bn_modelopt_fp8.onnx")
        yield "Model Optimizer export (e4m3 X)", exported, fuse(exported)[0]


@pytest.mark.parametrize("name", [n for n in CONV_SAMPLES if "dynamo" in n])
def test_fp8_fused_samples_run_on_the_fp8_kernels(name, capsys):
    import random

    from trt_fusedattn.launcher.launch import device_arch
    from trt_fusedattn.ort_session import run_model
    from trt_fusedattn.plugins.conv.plan import arch_number
    from trt_fusedattn.random_inputs import random_inputs
    from trt_fusedattn.verification import FP8_RTOL, verify

    if arch_number(device_arch()) < 89:
        pytest.skip(f"FP8 FusedConv needs sm_89+; this GPU is {device_arch()}")
    seed = random.SystemRandom().randrange(2 ** 31)
    for how, original, fused in _fused_models(name):
        feeds = random_inputs(original, seed=seed)
        nodes = []  # (inputs, attributes, reference output) of each node, in the emulated run
        recorded = lambda *a, **k: nodes.append((a, k, float16_reference(*a, **k))) or nodes[-1][2]  # noqa: E731
        run_model(fused, feeds, {FUSED_CONV: recorded})
        errors, producers = [], []  # normwise errors of 16-bit outputs; the chains' producers' e4m3 mismatches
        for args, attrs, want in nodes:
            got = gpu_fused_conv(*args, **attrs).astype(np.float64)
            if attrs["output_scale"]:  # e4m3 units, test_conv_gpu's rule (_fp8_chain_cases.e4m3_mismatch)
                producers.append(e4m3_mismatch(got, want.astype(np.float64)))
                errors.append((bool(attrs["input_scale"]), 0.0))
                continue
            errors.append((bool(attrs["input_scale"]),
                           float(np.linalg.norm(got - want) / max(np.linalg.norm(want.astype(np.float64)), 1e-30))))
        against_original = verify(original, fused, inputs=feeds, implementations={FUSED_CONV: gpu_fused_conv})
        with capsys.disabled():
            print(f"\n{name} {how} (seed {seed}): {sum(f for f, _ in errors)} FP8 nodes of {len(errors)}, "
                  f"{len(producers)} writing e4m3 for FP8 readers; kernel vs "
                  f"emulation worst {max(e for _, e in errors):.3g} (normwise); on the kernels vs original " +
                  ", ".join(f"{o.name} {o.max_rel:.3g} (rel_l2 {o.rel_l2:.3g})" for o in against_original.outputs))
        assert sum(f for f, _ in errors) == sum(FUSED_CONV.is_node(n) and FUSED_CONV.node_attributes(n)["input_scale"]
                                                > 0 for n in fused.graph.node) > 0
        assert max(e for _, e in errors) < KERNEL_VS_EMULATION, errors
        assert not any(producers), [p for p in producers if p]
        assert against_original.passed and all(o.rtol == FP8_RTOL for o in against_original.outputs), \
            against_original.table()


ATTENTION_KERNEL_VS_EMULATION = 0.08  # normwise, per node: tests/test_attention_fp8_gpu.py's kernel-vs-contract bound
                                      # (the kernel rounds P relative to its running max, the contract to the row's)


def gpu_fused_attention(q, k, v, mask=None, key_lengths=None, **attrs):
    """A FusedAttention node on our kernel (``trt_fusedattn.attention`` with torch tensors): Q/K/V as the node has
    them (float8_e4m3fn with their scales, or 16-bit), numpy in and out in the node's dtypes."""
    import trt_fusedattn
    from trt_fusedattn.fp8 import numpy_dtype
    from trt_fusedattn.plugins.attention.contract import output_dtype_name

    def dev(a):
        if a is None:
            return None
        a = np.ascontiguousarray(a)
        if a.dtype in (ml_dtypes.float8_e4m3fn, ml_dtypes.bfloat16):  # exact through float32
            wanted = torch.float8_e4m3fn if a.dtype == ml_dtypes.float8_e4m3fn else torch.bfloat16
            return torch.from_numpy(a.astype(np.float32)).to("cuda").to(wanted)
        return torch.from_numpy(a).to("cuda")

    o = trt_fusedattn.attention(dev(q), dev(k), dev(v), mask=dev(mask), key_lengths=dev(key_lengths),
                                causal=bool(attrs.pop("causal")), **attrs)
    return o.float().cpu().numpy().astype(numpy_dtype(output_dtype_name(np.asarray(q).dtype, attrs)))


def _fused_attention_models(name):
    from trt_fusedattn.pipeline import fuse

    model = sample(name)
    yield "calibrated", model, fuse(model, precision="fp8", calibration="random:8")[0]
    if name.endswith("torchscript"):  # the Softmax pattern Model Optimizer quantizes
        yield "Q/DQ", model, fuse(matmul_qdq_version(model))[0]


@pytest.mark.parametrize("name", FP8_ATTENTION_SAMPLES)
def test_fp8_attention_samples_run_on_the_fp8_kernel(name, capsys):
    """Every FP8 FusedAttention node of the FP8-fused BERT / Llama-GQA / ViT samples on the sm_90a FP8 kernel: node
    by node against the contract's FP8 emulation on the same inputs, and the whole model on the kernel against the
    float original (FP8_RTOL)."""
    import random

    from trt_fusedattn.launcher.launch import device_arch
    from trt_fusedattn.ort_session import run_model
    from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
    from trt_fusedattn.random_inputs import random_inputs
    from trt_fusedattn.verification import FP8_RTOL, verify

    if device_arch() != "sm_90a":
        pytest.skip(f"FP8 FusedAttention runs on sm_90a; this GPU is {device_arch()}")
    seed = random.SystemRandom().randrange(2 ** 31)
    for how, original, fused in _fused_attention_models(name):
        feeds = random_inputs(original, seed=seed)
        nodes = []
        def recorded(*args, **attrs):
            nodes.append((args, attrs, FUSED_ATTENTION.reference(*args, **attrs)))
            return nodes[-1][2]
        run_model(fused, feeds, {FUSED_ATTENTION: recorded})
        fp8 = [(a, k, want) for a, k, want in nodes if k["q_scale"]]
        errors = []
        for args, attrs, want in fp8:
            got = gpu_fused_attention(*args, **dict(attrs)).astype(np.float64)
            want = want.astype(np.float64)
            errors.append(float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)))
        against_original = verify(original, fused, inputs=feeds,
                                  implementations={FUSED_ATTENTION: lambda *a, **k: gpu_fused_attention(*a, **k)})
        with capsys.disabled():
            print(f"\n{name} {how} (seed {seed}): {len(fp8)} FP8 attention nodes of {len(nodes)}; kernel vs emulation "
                  f"per node {', '.join(f'{e:.3g}' for e in errors)} (normwise); on the kernel vs original " +
                  ", ".join(f"{o.name} {o.max_rel:.3g} (rel_l2 {o.rel_l2:.3g})" for o in against_original.outputs))
        assert len(fp8) == len(nodes) > 0
        assert max(errors) < ATTENTION_KERNEL_VS_EMULATION, errors
        assert against_original.passed and all(o.rtol == FP8_RTOL for o in against_original.outputs), \
            against_original.table()
