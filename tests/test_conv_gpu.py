"""FusedConv kernels on the GPU: every case against the float64 numpy reference on fresh random inputs (outputs
poisoned with NaN first), FP8 (e4m3) cases on sm_89+, the direct API on torch and CuPy arrays and the caller's
stream, its errors, and the fused ResNet / MobileNetV2 samples with their FusedConv nodes run by these kernels."""
from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from _conv_cases import CASES, DEPTHWISE_CHUNK_PLANS, FP8_CASES, WGMMA_CASES, WS_CASES, X_E4M3_CASES, ConvCase
from _fp8_chain_cases import PRODUCER_CASES, ProducerCase, e4m3_mismatch
from trt_fusedattn.plugins.conv.contract import FUSED_CONV, fused_conv_reference

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

# Normwise relative error against float64. FP8 cases use the same bounds: the reference quantizes X and reads W
# exactly as the kernel does (e4m3 products are exact in fp32), so what is left is fp32 accumulation order (Hopper's
# FP8 tensor-core adds keep fewer bits) and the output rounding (fp16 ~3e-4, bf16 ~2e-3 normwise); a rare X element
# within 2^-20 of an e4m3 rounding tie may round the other way (the kernel multiplies by 1/input_scale in fp32).
TOLERANCE = {"float16": 2e-3, "bfloat16": 1.2e-2}
SAMPLES = Path(__file__).resolve().parents[1] / "models" / "samples"


@pytest.fixture(scope="module", autouse=True)
def compiled_specializations(request):
    """Compile the selected tests' PTX up front, in parallel (nvcc is single-threaded; the tests then hit the
    cache): each selected case's plan, FP8 ones under the main loop their test asks for (e4m3-X ones: the
    default), sm_90a's wgmma variants with their overrides."""
    import os
    from trt_fusedattn.launcher.compile import compile_ptx
    from trt_fusedattn.launcher.launch import device_arch
    arch = device_arch(0)
    # this module's selected tests only: other modules' "case" parameters are strings or attention cases
    selected = [item.callspec.params for item in request.session.items
                if hasattr(item, "callspec") and getattr(item, "module", None) is request.module]
    plans = [p["case"].plan(arch) for p in selected if "case" in p and not p["case"].fp8]
    if has_fp8(arch):
        plans += [p["case"].plan(arch, **({} if p["case"].x_e4m3 else {"mma": p.get("mma", "mma.sync")}))
                  for p in selected if "case" in p and p["case"].fp8]
    if arch == "sm_90a":
        plans += [p["tuned"].plan(arch) for p in selected if "tuned" in p]
    if has_fp8(arch):  # FP8 producers (e4m3 Y) on the plan's default, FP8 ones on mma.sync too
        plans += [p["producer"].plan(arch, **({"mma": p["mma"]} if p["producer"].case.fp8 else {}))
                  for p in selected if "producer" in p]
    plans = list({(p.source, tuple(sorted(p.defines.items()))): p for p in plans}.values())
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 8) as pool:
        list(pool.map(lambda p: compile_ptx(p.source, arch, p.defines), plans))


def has_fp8(arch: str) -> bool:
    from trt_fusedattn.plugins.conv.plan import arch_number
    return arch_number(arch) >= 89


def fp8_gpu_arch() -> str:
    """This GPU's arch; the test is skipped where FusedConv has no FP8 (sm_89+: e4m3 tensor cores)."""
    from trt_fusedattn.launcher.launch import device_arch
    arch = device_arch(0)
    if not has_fp8(arch):
        pytest.skip(f"FP8 FusedConv needs sm_89+ (e4m3 tensor cores); this GPU is {arch}")
    return arch


def channels_last(t):
    return t.contiguous(memory_format=torch.channels_last)


def make_inputs(case: ConvCase, gen) -> dict:
    """Fresh random device tensors: x, w (torch layout [K, C/G, kH, kW], channels-last), shift, scale, residual."""
    dtype = getattr(torch, case.dtype)
    rand = lambda *shape: torch.randn(shape, generator=gen, device="cuda")  # noqa: E731
    fan_in = case.c // case.groups * case.kh * case.kw
    p, q = case.out_hw
    w = channels_last(rand(case.k, case.c // case.groups, case.kh, case.kw) * 2 / fan_in ** 0.5)
    inputs = {"x": channels_last(rand(case.n, case.c, case.h, case.w).to(dtype)), "w": w.to(dtype)}
    if case.shift:
        inputs["bias"] = rand(case.k) * 0.5
    if case.scale:
        inputs["scale"] = torch.rand(case.k, generator=gen, device="cuda") + 0.5
    if case.fp8:  # e4m3 weights (channels-last kept by .to) with their per-output-channel scale
        inputs["scale"] = w.abs().amax(dim=(1, 2, 3)) / 448
        inputs["w"] = (w / inputs["scale"][:, None, None, None]).to(torch.float8_e4m3fn)
    if case.x_e4m3:  # as an FP8 producer writes X: e4m3(x / input_scale), saturated
        inputs["x"] = (inputs["x"].float() / case.input_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    if case.residual:
        inputs["residual"] = channels_last(rand(case.n, case.k, p, q).to(dtype))
    return inputs


def host64(t) -> np.ndarray | None:
    return None if t is None else t.detach().float().cpu().numpy().astype(np.float64)


def reference(case: ConvCase, inputs: dict) -> np.ndarray:
    w = host64(inputs["w"]).transpose(0, 2, 3, 1)  # OIHW -> the contract's OHWI
    x = host64(inputs["x"]) * (case.input_scale if case.x_e4m3 else 1.0)  # e4m3 X: the values it stands for
    return fused_conv_reference(x, w, host64(inputs.get("bias")), host64(inputs.get("scale")),
                                host64(inputs.get("residual")), **case.attrs())  # FP8: quantizes X itself


def run_case(case: ConvCase, seed: int, **api_kwargs):
    """(kernel output as float64, reference, output tensor) for one case on fresh inputs from ``seed``."""
    import trt_fusedattn
    gen = torch.Generator(device="cuda").manual_seed(seed)
    inputs = make_inputs(case, gen)
    attrs = case.attrs()
    out = channels_last(torch.full((case.n, case.k, *case.out_hw), float("nan"), device="cuda",
                                   dtype=getattr(torch, case.dtype)))
    result = trt_fusedattn.conv2d(
        inputs["x"], inputs["w"], inputs.get("bias"), scale=inputs.get("scale"), stride=case.stride,
        padding=case.pad, dilation=case.dil, groups=case.groups, activation=case.activation,
        activation_alpha=attrs["activation_alpha"], activation_beta=attrs["activation_beta"],
        residual=inputs.get("residual"), post_activation=case.post_activation,
        post_activation_alpha=attrs["post_activation_alpha"], post_activation_beta=attrs["post_activation_beta"],
        input_scale=case.input_scale, out=out, **api_kwargs)
    assert result is out
    torch.cuda.synchronize()
    return host64(out), reference(case, inputs), out


def check(case: ConvCase, got: np.ndarray, want: np.ndarray, seed: int):
    assert np.isfinite(got).all(), f"{case.name} (seed {seed}): {np.isnan(got).sum()} outputs unwritten or NaN"
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    worst = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    tol = TOLERANCE[case.dtype]
    assert err <= tol and worst <= 8 * tol, (f"{case.name} (seed {seed}): relative error {err:.3g}, worst element "
                                             f"{worst:.3g} of max |ref|; tolerance {tol:g}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_float64_reference(case):
    seed = random.SystemRandom().randrange(2 ** 31)  # fresh inputs every run; the seed is in any failure message
    got, want, _ = run_case(case, seed)
    check(case, got, want, seed)


@pytest.mark.parametrize("blocks", [3, 4])
@pytest.mark.parametrize("case", [c for c in CASES if "stem" in c.name or "tap_rows" in c.name], ids=lambda c: c.name)
def test_tap_row_gather_at_either_register_cap(case, blocks, monkeypatch):
    """The tap-row cases with the kernel's registers capped for 3 and for 4 blocks per SM (4 with 3 stages: the
    plan's b32 stem; small test grids get 3 by default, switched here)."""
    from trt_fusedattn.plugins.conv import plan as conv_plan
    from trt_fusedattn.launcher.launch import device_arch
    monkeypatch.setattr(conv_plan, "TAP_ROWS_WAVE_COST", {blocks: 1.0})
    d = case.plan(device_arch(0)).defines
    if "TAP_ROWS" not in d or d["TAP_ROWS_BLOCKS"] != blocks:
        pytest.skip(f"{case.name}: no {blocks}-block tap-row kernel on this GPU (sm_90a only for 4)")
    seed = random.SystemRandom().randrange(2 ** 31)
    got, want, _ = run_case(case, seed)
    check(case, got, want, seed)


@pytest.mark.parametrize("pixels", [2, 4])
@pytest.mark.parametrize("case", [c for c in CASES if c.groups == c.c > 1 and not c.name.startswith("dw_act")],
                         ids=lambda c: c.name)
def test_depthwise_threads_of_several_pixels(case, pixels, monkeypatch):
    """The depthwise kernel with each thread on 2 and 4 output pixels (DW_PIX; the last block's threads have pixels
    past N*P*Q), stride 2, a 5x5 filter, a channel multiplier, odd channels, a residual; the whole-pixel block rule
    (which sets its own count) off."""
    from trt_fusedattn.plugins.conv import plan as conv_plan
    from trt_fusedattn.launcher.launch import device_arch
    monkeypatch.setattr(conv_plan, "depthwise_pixels", lambda tile, geo, n_p_q: pixels)
    monkeypatch.setattr(conv_plan, "DW_WHOLE_PIXEL_BYTES", 0)
    assert case.plan(device_arch(0)).defines["DW_PIX"] == pixels
    seed = random.SystemRandom().randrange(2 ** 31)
    got, want, _ = run_case(case, seed)
    check(case, got, want, seed)


@pytest.mark.parametrize("mma", ["mma.sync", "wgmma"])
@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: c.name)
def test_fp8_matches_float64_reference(case, mma, monkeypatch):
    """Both FP8 main loops (the API runs the plan's default: switched here) on every FP8 case."""
    from trt_fusedattn.plugins.conv import plan as conv_plan
    arch = fp8_gpu_arch()
    if mma == "wgmma" and "WGMMA" not in case.plan(arch, mma="wgmma").defines:
        pytest.skip(f"no wgmma path for {case.name} on {arch} (sm_90a, 16-byte loads only)")
    monkeypatch.setattr(conv_plan, "FP8_WGMMA_BY_DEFAULT", mma == "wgmma")
    assert ("WGMMA" in case.plan(arch).defines) == (mma == "wgmma")
    seed = random.SystemRandom().randrange(2 ** 31)
    got, want, _ = run_case(case, seed)
    check(case, got, want, seed)


@pytest.mark.parametrize("case", X_E4M3_CASES, ids=lambda c: c.name)
def test_e4m3_activations_match_float64_reference(case):
    """X already e4m3 in memory (an FP8 producer's output): float16 Y from the plan's default on this GPU."""
    fp8_gpu_arch()
    seed = random.SystemRandom().randrange(2 ** 31)
    got, want, out = run_case(case, seed)
    assert out.dtype == torch.float16
    check(case, got, want, seed)


@pytest.mark.parametrize("tuned", WGMMA_CASES + WS_CASES, ids=lambda t: t.name)
def test_wgmma_variants_match_float64_reference(tuned):
    """The sm_90a wgmma main loop and the warp-specialized kernel (WS_CASES, mma="wgmma_ws") forced onto every
    warpgroup tile, cluster split and taps-inner order (plan overrides the default may not pick), launched as
    TensorRT would from the plan, against float64."""
    from trt_fusedattn.launcher.launch import device_arch
    arch = device_arch(0)
    if arch != "sm_90a":
        pytest.skip(f"the wgmma main loop is sm_90a's; this GPU is {arch}")
    plan = tuned.plan(arch)
    assert plan.defines.get("WGMMA") == 1, f"{tuned.name}: the plan fell back to mma.sync"
    check_plan(tuned.case, plan, arch)


@pytest.mark.parametrize("case, overrides", DEPTHWISE_CHUNK_PLANS,
                         ids=[f"{c.name}_chunks{o['dw_chunks']}_px{o['dw_pixels']}" for c, o in DEPTHWISE_CHUNK_PLANS])
def test_depthwise_blocks_of_any_chunk_count(case, overrides):
    """Depthwise blocks of channel chunk counts that do not divide 256 (the last 256 % CHUNKS threads only load taps),
    more chunks than the layer has (whole idle columns), at 1 and 2 pixels a thread."""
    from trt_fusedattn.launcher.launch import device_arch
    arch = device_arch(0)
    plan = case.plan(arch, **overrides)
    assert (plan.defines["CHUNKS"], plan.defines["DW_PIX"]) == (overrides["dw_chunks"], overrides["dw_pixels"])
    check_plan(case, plan, arch)


def check_plan(case: ConvCase, plan, arch: str):
    """Launch ``plan`` (a tuning override of the case's default plan) on fresh inputs into a NaN-poisoned output, as
    TensorRT would, and check it against float64."""
    from trt_fusedattn.launcher.launch import launch
    seed = random.SystemRandom().randrange(2 ** 31)
    inputs = make_inputs(case, torch.Generator(device="cuda").manual_seed(seed))
    out = channels_last(torch.full((case.n, case.k, *case.out_hw), float("nan"), device="cuda",
                                   dtype=getattr(torch, case.dtype)))
    w_ohwi = inputs["w"]  # channels-last [K, C/G, kH, kW] is OHWI in memory
    ptrs = [inputs["x"].data_ptr(), w_ohwi.data_ptr()] + [
        None if inputs.get(k) is None else inputs[k].data_ptr() for k in ("bias", "scale", "residual")]
    launch(plan, arch, ptrs, [out.data_ptr()], stream=torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    check(case, host64(out), reference(case, inputs), seed)


def test_fp8_weights_need_an_input_scale():
    import trt_fusedattn
    x = channels_last(torch.randn(1, 16, 8, 8, device="cuda", dtype=torch.half))
    w = channels_last(torch.randn(16, 16, 3, 3, device="cuda")).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="input_scale"):
        trt_fusedattn.conv2d(x, w)


def test_runs_on_the_callers_stream():
    case = next(c for c in CASES if c.name == "3x3_c48_k40")
    stream = torch.cuda.Stream()
    seed = random.SystemRandom().randrange(2 ** 31)
    with torch.cuda.stream(stream):
        got, want, _ = run_case(case, seed)
    check(case, got, want, seed)


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    import trt_fusedattn
    case = next(c for c in CASES if c.name == "3x3_c64_k64_17x13")
    rng = np.random.default_rng()
    x = rng.standard_normal((case.n, case.h, case.w, case.c)).astype(np.float16)   # NHWC
    w = (rng.standard_normal((case.k, case.kh, case.kw, case.c)) * 0.1).astype(np.float16)  # OHWI
    bias = rng.standard_normal(case.k).astype(np.float32)
    y = trt_fusedattn.conv2d(cupy.asarray(x).transpose(0, 3, 1, 2), cupy.asarray(w).transpose(0, 3, 1, 2),
                             cupy.asarray(bias), padding=case.pad, activation="relu")
    cupy.cuda.get_current_stream().synchronize()
    assert isinstance(y, cupy.ndarray) and y.shape == (case.n, case.k, *case.out_hw)
    want = fused_conv_reference(x.transpose(0, 3, 1, 2).astype(np.float64), w.astype(np.float64), bias,
                                strides=(1, 1), pads=(1,) * 4, activation="relu")
    got = cupy.asnumpy(y).astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < TOLERANCE["float16"]


def test_rejects_channels_first_input():
    import trt_fusedattn
    from trt_fusedattn.launcher.arrays import ArrayError
    x = torch.randn(1, 16, 8, 8, device="cuda", dtype=torch.half)
    w = channels_last(torch.randn(16, 16, 3, 3, device="cuda", dtype=torch.half))
    with pytest.raises(ArrayError, match="channels-last"):
        trt_fusedattn.conv2d(x, w)


def gpu_fused_conv(x, w, shift=None, scale=None, residual=None, **attrs):
    """A FusedConv node evaluated by our kernel: numpy in (contract layouts), float16 on the GPU, numpy out."""
    import trt_fusedattn
    one_d = x.ndim == 3
    if one_d:  # [N, C, W] -> [N, C, 1, W]
        x, w = x[:, :, None], w[:, None]
        attrs = dict(attrs, strides=(1, *attrs["strides"]), dilations=(1, *attrs["dilations"]),
                     pads=(0, attrs["pads"][0], 0, attrs["pads"][1]))
    assert not attrs["input_scale"], "FP8 nodes are not in the fp32 samples"
    dev = lambda a, dtype=torch.half: None if a is None else torch.from_numpy(np.ascontiguousarray(a)).to(  # noqa
        "cuda", dtype)
    xt = channels_last(dev(x))
    wt = dev(w).permute(0, 3, 1, 2)  # OHWI memory seen as [K, C/G, kH, kW]: channels-last
    res = None if residual is None else channels_last(dev(residual if not one_d else residual[:, :, None]))
    y = trt_fusedattn.conv2d(xt, wt, dev(shift, torch.float32), scale=dev(scale, torch.float32),
                             stride=tuple(attrs["strides"]) or 1, padding=tuple(attrs["pads"]) or 0,
                             dilation=tuple(attrs["dilations"]) or 1, groups=attrs["group"],
                             activation=attrs["activation"], activation_alpha=attrs["activation_alpha"],
                             activation_beta=attrs["activation_beta"], residual=res,
                             post_activation=attrs["post_activation"],
                             post_activation_alpha=attrs["post_activation_alpha"],
                             post_activation_beta=attrs["post_activation_beta"])
    y = y.float().cpu().numpy()
    return (y[:, :, 0] if one_d else y).astype(x.dtype)


@pytest.mark.parametrize("sample", ["resnet_torchscript", "resnet_dynamo", "mobilenetv2_torchscript",
                                    "mobilenetv2_dynamo"])
def test_fused_sample_models_match_the_originals(sample):
    pytest.importorskip("onnxruntime_extensions")
    import trt_fusedattn
    from trt_fusedattn.verification import verify
    path = SAMPLES / f"{sample}.onnx"
    fused, report = trt_fusedattn.fuse(str(path))
    assert sum(n.op_type == "FusedConv" for n in fused.graph.node) > 0
    calls = []
    counted = lambda *a, **k: calls.append(1) or gpu_fused_conv(*a, **k)  # noqa: E731
    result = verify(str(path), fused, seed=random.SystemRandom().randrange(2 ** 31), rtol=2e-2,
                                  implementations={FUSED_CONV: counted})
    assert len(calls) == sum(n.op_type == "FusedConv" for n in fused.graph.node)
    assert result.passed, result.table()


# FP8 producers (output_scale: Y = e4m3(y / output_scale)) against the reference's emulation (the rule and why:
# _fp8_chain_cases.e4m3_mismatch).


def run_producer(producer: ProducerCase, seed: int):
    """(kernel's e4m3 output in e4m3 units as float64, the reference's, the reference's y / output_scale before
    the conversion, the output tensor) on fresh inputs from ``seed``."""
    import trt_fusedattn
    case, attrs = producer.case, producer.attrs()
    inputs = make_inputs(case, torch.Generator(device="cuda").manual_seed(seed))
    nan = torch.full((case.n, case.k, *case.out_hw), 0x7F, device="cuda", dtype=torch.uint8)  # e4m3 NaN
    out = channels_last(nan).view(torch.float8_e4m3fn)
    trt_fusedattn.conv2d(
        inputs["x"], inputs["w"], inputs.get("bias"), scale=inputs.get("scale"), stride=case.stride,
        padding=case.pad, dilation=case.dil, groups=case.groups, activation=case.activation,
        activation_alpha=attrs["activation_alpha"], activation_beta=attrs["activation_beta"],
        residual=inputs.get("residual"), post_activation=case.post_activation,
        post_activation_alpha=attrs["post_activation_alpha"], post_activation_beta=attrs["post_activation_beta"],
        input_scale=case.input_scale, output_scale=producer.output_scale, out=out)
    torch.cuda.synchronize()
    x_values = host64(inputs["x"]) * (case.input_scale if inputs["x"].dtype == torch.float8_e4m3fn else 1.0)
    args = (x_values, host64(inputs["w"]).transpose(0, 2, 3, 1), host64(inputs.get("bias")),
            host64(inputs.get("scale")), host64(inputs.get("residual")))
    want = fused_conv_reference(*args, **attrs).astype(np.float64)
    y = fused_conv_reference(*args, **{**attrs, "output_scale": 0.0}) / producer.output_scale
    return host64(out), want, y, out


def check_producer(producer: ProducerCase, got: np.ndarray, want: np.ndarray, unquantized: np.ndarray, seed: int):
    where = f"{producer.name} (seed {seed})"
    problem = e4m3_mismatch(got, want, producer.case.dtype)
    assert not problem, f"{where}: {problem}"
    beyond = np.abs(unquantized) > 480  # clearly past e4m3's largest value (448; the next step would be 480)
    assert (np.abs(got[beyond]) == 448).all(), f"{where}: an output past 448 * output_scale did not saturate"
    if "saturating" in producer.name:
        assert beyond.mean() > 0.05, f"{where}: the case should saturate many outputs"


@pytest.mark.parametrize("mma", ["wgmma", "mma.sync"])
@pytest.mark.parametrize("producer", PRODUCER_CASES, ids=lambda p: p.name)
def test_fp8_producer_writes_the_references_e4m3(producer, mma, monkeypatch):
    """Each producer case on both FP8 main loops (16-bit producers and depthwise: their one kernel)."""
    from trt_fusedattn.plugins.conv import plan as conv_plan
    fp8_gpu_arch()
    if mma == "mma.sync" and not producer.case.fp8:
        pytest.skip("a 16-bit or depthwise producer has one kernel (run under wgmma)")
    monkeypatch.setattr(conv_plan, "FP8_WGMMA_BY_DEFAULT", mma == "wgmma")
    seed = random.SystemRandom().randrange(2 ** 31)
    got, want, y, out = run_producer(producer, seed)
    assert out.dtype == torch.float8_e4m3fn
    check_producer(producer, got, want, y, seed)


def test_fp8_chain_consumer_reads_what_its_producer_wrote():
    """A producer's e4m3 output straight into an FP8 consumer (X_E4M3, input_scale = output_scale): the consumer
    matches its reference on exactly those bytes (float16 bound), the producer its own."""
    fp8_gpu_arch()
    producer = next(p for p in PRODUCER_CASES if p.name == "y8_fp8_1x1_c256_k64_residual")
    seed = random.SystemRandom().randrange(2 ** 31)
    got, want, y, y8 = run_producer(producer, seed)
    check_producer(producer, got, want, y, seed)
    consumer = ConvCase("x8_3x3_c64_k128", 2, 64, 9, 11, 128, 3, 3, pad=1, scale=True,
                        input_scale=producer.output_scale, x_e4m3=True, residual=True, post_activation="relu")
    import trt_fusedattn
    inputs = make_inputs(consumer, torch.Generator(device="cuda").manual_seed(seed + 1))
    out = channels_last(torch.full((2, 128, 9, 11), float("nan"), device="cuda", dtype=torch.half))
    trt_fusedattn.conv2d(y8, inputs["w"], inputs["bias"], scale=inputs["scale"], padding=1, activation="relu",
                         residual=inputs["residual"], post_activation="relu", input_scale=producer.output_scale,
                         out=out)
    torch.cuda.synchronize()
    check(consumer, host64(out), reference(consumer, {**inputs, "x": y8}), seed)
