"""Our TensorRT layer against NVIDIA's own ``tensorrt.plugin`` code of TensorRT 10.9, the newest 10.x and 11.x.

NVIDIA's plugin package comes from each line's ``tensorrt-cu12-bindings`` wheel (fetched into a cache by
``tensorrt_conformance/wheels.py``; skipped with the reason when PyPI cannot be reached) and runs over a
stand-in for the compiled bindings (``tensorrt_conformance/standin.py``). ``tensorrt_conformance/builder.py``
makes the ONNX parser's and the builder's calls into our plugins and checks the rules it lists there (P1-P4,
N1, B1-B4, K1, each with its source). This is not TensorRT: it proves that our registration, attributes,
inputs, output types and shapes, formats, launch parameters and kernels are what NVIDIA's code and TensorRT's
documented rules accept; what only a real builder can answer is in ``trt_fusedattn/tensorrt/NOTES.md``.

Asserted on every line: every committed sample's fused model builds (float32 models with precision fp16: Casts
around the custom nodes; bf16 and FP8-conv variants too); the launch parameters TensorRT would evaluate equal the
direct launcher's plan at the same shapes; the PTX entry takes exactly the AOT parameter list.
"""
from __future__ import annotations

import functools
import inspect
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorrt_conformance.builder import BuildFailure, entry_parameters, simulate, tensorrt_line
from tensorrt_conformance.wheels import VERSIONS, WheelsUnavailable, plugin_sources
from trt_fusedattn.launcher.arch import shared_limit
from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.tensorrt import build, plugins, prepare
from trt_fusedattn.tensorrt.symbolic import SymbolicDim

# NVIDIA's sources have docstrings with "\s" (a DeprecationWarning, SyntaxWarning from Python 3.12, on import)
pytestmark = [pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:invalid escape sequence:SyntaxWarning")]
ARCH = "sm_90a"  # the building GPU of the simulation (no GPU here: the plugins are told)
SAMPLES = sorted(Path(__file__).resolve().parents[1].joinpath("models", "samples").glob("*.onnx"))


@pytest.fixture(scope="module", params=VERSIONS)
def line(request):
    """(stand-in tensorrt, NVIDIA's tensorrt.plugin) of one TensorRT line, installed as ``tensorrt``."""
    try:
        plugin_dir = plugin_sources(request.param)
    except WheelsUnavailable as err:
        pytest.skip(str(err))
    with tensorrt_line(request.param, plugin_dir) as modules:
        yield modules


@pytest.fixture(autouse=True)
def building_arch(monkeypatch):
    monkeypatch.setattr(plugins, "_building_arch", lambda: ARCH)


@functools.lru_cache(maxsize=None)
def fused(path: Path, precision: str | None = None) -> onnx.ModelProto:
    """The sample's fused model (``precision="fp8"``: every FusedConv with an FP8 kernel made FP8, e4m3 weights
    with calibrated scales)."""
    import trt_fusedattn
    calibration = {"calibration": "random:2"} if precision == "fp8" else {}
    model, _ = trt_fusedattn.fuse(str(path), precision=precision, **calibration)
    return model


def sample(stem: str) -> Path:
    return next(p for p in SAMPLES if p.stem == stem)


# The sample builds of the tests below, (variant, sample, building arch): "own" builds in the model's dtypes
# (float32 custom nodes with precision fp16), "bf16" with precision bf16, "fp8" the fuse(precision="fp8") model.
BF16_SAMPLES = ("bert_sdpa_dynamo", "resnet_torchscript", "mobilenetv2_dynamo")
# opset 17; depthwise layers stay 16-bit; a 3-channel stem and a stride-16 patch conv; Model Optimizer's Q/DQ export
FP8_MODELS = (sample("resnet_torchscript"), sample("mobilenetv2_dynamo"), sample("vit_dynamo"),
              Path(__file__).resolve().parent / "data" / "resnet_bn_modelopt_fp8.onnx")
OTHER_ARCHES = (("sm_80", "resnet_torchscript"), ("sm_89", "bert_sdpa_fp16_dynamo"))
# FP8 attention (heads of 64, models/samples/fp8): BERT's Softmax pattern with a boolean mask, Llama's GQA + causal,
# Model Optimizer's Q/DQ export of the ViT sample (its attention Q/DQ absorbed, the projections' left to TensorRT)
FP8_ATTENTION_MODELS = tuple(SAMPLES[0].parent / "fp8" / f"{stem}.onnx"
                             for stem in ("bert_sdpa_hd64_torchscript", "llama_gqa_hd64_torchscript")) + (
    Path(__file__).resolve().parent / "data" / "vit_hd64_modelopt_fp8.onnx",)


def model_and_precision(variant: str, path: Path) -> tuple[onnx.ModelProto, str | None]:
    if variant == "fp8":
        return fused(path, "fp8"), "fp8"
    model = fused(path)
    return model, ("bf16" if variant == "bf16" else own_precision(model))


def sample_builds(request) -> list:
    """The (variant, sample path, arch) builds the selected tests of this module will make."""
    builds = []
    for item in request.session.items:
        if getattr(item, "module", None) is not request.module or not hasattr(item, "callspec"):
            continue
        params, name = item.callspec.params, item.originalname
        if name == "test_every_sample_fused_model_builds":
            builds.append(("own", params["path"], ARCH))
        elif name == "test_bfloat16_builds":
            builds.append(("bf16", sample(params["stem"]), ARCH))
        elif name in ("test_fp8_conv_builds_with_quantized_weights", "test_fp8_attention_builds"):
            builds.append(("fp8", params["path"], ARCH))
        elif name == "test_ampere_and_ada_builds":
            builds.append(("own", sample(params["stem"]), params["arch"]))
    return list(dict.fromkeys(builds))


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels(request):
    """Compile every PTX the selected sample builds ask for first, in parallel (nvcc is single-threaded and the
    builds run one node at a time): a dry run of those builds on one TensorRT line records each kernel the
    plugins ask the launcher for; the builds proper then find them in the launcher's cache."""
    import os
    from concurrent.futures import ThreadPoolExecutor
    from trt_fusedattn.launcher.compile import compile_ptx
    builds = sample_builds(request)
    try:
        plugin_dir = plugin_sources(VERSIONS[-1]) if builds else None
    except WheelsUnavailable:
        return
    wanted = {}

    def record(source, arch, defines):
        wanted[(str(source), arch, tuple(sorted(defines.items())))] = (source, arch, defines)
        return ""

    with pytest.MonkeyPatch.context() as patch, tensorrt_line(VERSIONS[-1], plugin_dir) as modules:
        patch.setattr(plugins, "compile_ptx", record)
        for variant, path, arch in builds:
            patch.setattr(plugins, "_building_arch", lambda arch=arch: arch)
            model, precision = model_and_precision(variant, path)
            try:
                simulate(*modules, model, precision)
            except Exception:  # noqa: BLE001 - the test of that build reports it
                continue
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(lambda spec: compile_ptx(*spec), wanted.values()))


def own_precision(model: onnx.ModelProto) -> str | None:
    """None (the model's dtypes) when the custom nodes compute in float16, fp16 (Casts around them) when in
    float32."""
    types = prepare.element_types(model)
    first = next(n for n in model.graph.node if n.domain == "trt_fusedattn")
    return "fp16" if types.get(first.input[0]) == TensorProto.FLOAT else None


def _formats(op, formats) -> dict:
    """The ``formats=`` keyword the TensorRT layer passes a plan that takes it."""
    return {"formats": formats} if "formats" in inspect.signature(op.plan).parameters else {}


def _as_built(shapes: list, dynamic: set) -> list:
    """``shapes`` as the plugin sees them when TensorRT builds: each dynamic dimension (input, axis) a SymbolicDim
    holding this run's value, so that the plan can do arithmetic on it but cannot choose a tile by it."""
    return [None if shape is None else tuple(SymbolicDim(d) if (i, j) in dynamic else d for j, d in enumerate(shape))
            for i, shape in enumerate(shapes)]


def _value(dim):
    return dim.expr if isinstance(dim, SymbolicDim) else dim


def check_launches(build_result, expected_ops: set, arch: str = ARCH, symbolic: bool = True) -> None:
    """Every plugin node got a kernel whose launch, evaluated at the input sizes of two runs, equals the op's plan
    at those shapes as TensorRT gives them (dynamic dimensions symbolic) and TensorRT's formats, from one PTX: the
    same defines at both sizes; in a static model also the direct launcher's plan (dense arrays, no formats), so the
    engine runs the kernel the GPU tests run (a padded HWC8 input differs only in the pixel-stride scalar). In a
    dynamic model the direct launcher, which knows the sizes, may choose by them (FusedConv's tile for a static
    N*P*Q); the engine's plan is the one without them. The PTX entry takes the AOT parameter list (K1); shared
    memory fits the building GPU."""
    assert build_result.launches, "no plugin node was built"
    assert {launch.op.contract.name for launch in build_result.launches} >= expected_ops
    for launch in build_result.launches:
        formats = tuple(launch.formats[sum(s is not None for s in launch.input_shapes[:i])]
                        if shape is not None else None for i, shape in enumerate(launch.input_shapes))
        formats += (launch.formats[-1],)
        # For a dynamic input the engine's kernel is the plan at its symbolic dims, so that is what the launches must
        # match (the direct launcher, which knows the run's sizes, may tile by them).
        dynamic = {(i, j) for i, shape in enumerate(launch.input_shapes) if shape is not None
                   for j, d in enumerate(shape) if d != launch.other_shapes[i][j]}
        plans = [launch.op.plan(_as_built(shapes, dynamic), launch.input_dtypes, launch.attrs, arch,
                                **_formats(launch.op, formats))
                 for shapes in (launch.input_shapes, launch.other_shapes)]
        assert plans[0].defines == plans[1].defines, "one PTX must serve both sizes"
        if not dynamic:
            direct = launch.op.plan(launch.input_shapes, launch.input_dtypes, launch.attrs, arch)
            assert plans[0].defines == direct.defines, "TensorRT and the direct launcher differ"
        assert plans[0].kernel == plans[1].kernel == launch.kernel
        for other, plan in enumerate(plans):
            got = {k: launch.value(e, bool(other)) for k, e in launch.launch.items()}
            assert (got["grid_x"], got["grid_y"], got["grid_z"]) == (tuple(map(_value, plan.grid)) + (1, 1))[:3], \
                launch.node
            assert (got["block_x"], got["block_y"], got["block_z"]) == (tuple(plan.block) + (1, 1))[:3]
            assert got["shared_mem"] == _value(plan.shared_mem) <= shared_limit(arch), launch.node
            assert [launch.value(e, bool(other)) for e in launch.extra_args] == list(map(_value, plan.scalars)), \
                launch.node
        n_inputs = sum(shape is not None for shape in launch.input_shapes)
        assert entry_parameters(launch.ptx, launch.kernel) == \
            ["u64"] * n_inputs + ["u32"] * len(plans[0].scalars) + ["u64"], launch.node
    if symbolic:  # a model with dynamic inputs: its plugins' launches must have been checked at two sizes
        assert any(launch.input_shapes != launch.other_shapes for launch in build_result.launches), \
            "the two runs had the same shapes: nothing symbolic was checked"


def test_registration_passes_nvidias_validators_and_declares_parser_typed_fields(line):
    """register/autotune/aot_impl signatures pass tensorrt.plugin's checks; ints and floats are declared as the
    int32/float32 the parser passes (P2), so no version turns a one-element array into a number with int()."""
    trt, trtp = line
    names = plugins.register_ops(trtp)
    assert names == ["trt_fusedattn::FusedAttention", "trt_fusedattn::FusedConv"]
    assert plugins.register_ops(trtp) == names  # once per module
    creator = trt.get_plugin_registry().get_creator("FusedConv", "1", "trt_fusedattn")
    types = {f.name: f.type.name for f in creator.field_names}
    assert types["group"] == types["strides"] == types[prepare.PRESENT_INPUTS] == "INT32"
    assert types["input_scale"] == "FLOAT32" and types["activation"] == "CHAR"


def test_an_int_annotated_attribute_is_what_numpy_2_4_breaks_before_tensorrt_11(line):
    """Why our int/float attributes are declared as arrays: tensorrt.plugin before 11.0 turns the parser's
    one-element INT32 field into an ``int``-annotated attribute with ``int(array)``, which NumPy >= 2.4 refuses."""
    trt, trtp = line

    def int_attribute(x, n):
        return x.like()

    P = inspect.Parameter  # real annotations (this module's are strings: ``from __future__ import annotations``)
    int_attribute.__signature__ = inspect.Signature(
        [P("x", P.POSITIONAL_OR_KEYWORD, annotation=trtp.TensorDesc), P("n", P.POSITIONAL_OR_KEYWORD, annotation=int)],
        return_annotation=trtp.TensorDesc)
    trtp.register("trt_fusedattn_probe::IntAttribute")(int_attribute)
    trtp.impl("trt_fusedattn_probe::IntAttribute")(lambda x, n, outputs, stream: None)

    creator = trt.get_plugin_registry().get_creator("IntAttribute", "1", "trt_fusedattn_probe")
    fields = trt.PluginFieldCollection([trt.PluginField("n", [3], trt.PluginFieldType.INT32)])
    create = lambda: creator.create_plugin("IntAttribute", "trt_fusedattn_probe", fields,  # noqa: E731
                                           trt.TensorRTPhase.BUILD, trt.QuickPluginCreationRequest.PREFER_JIT)
    numpy_refuses = tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 4)
    if numpy_refuses and int(trt.__version__.split(".")[0]) < 11:
        with pytest.raises(TypeError, match="0-dimensional"):
            create()
    else:
        assert create().attrs["n"] == 3


def test_networks_are_strongly_typed_and_prefer_aot_plugins(line):
    trt, _ = line
    flags = build._network_flags(trt)
    for name in ("STRONGLY_TYPED", "PREFER_AOT_PYTHON_PLUGINS"):
        assert flags >> int(getattr(trt.NetworkDefinitionCreationFlag, name)) & 1


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_every_sample_fused_model_builds(line, path):
    model, precision = model_and_precision("own", path)
    ops = {n.op_type for n in model.graph.node if n.domain == "trt_fusedattn"}
    if not ops:
        pytest.skip(f"{path.name}: nothing fused")
    check_launches(simulate(*line, model, precision), ops, symbolic=_has_dynamic_inputs(model))


def _has_dynamic_inputs(model) -> bool:
    """Whether any graph input has a dimension that is not a fixed number (a static model has one size only)."""
    initializers = {t.name for t in model.graph.initializer}
    return any(dim.dim_param or not dim.HasField("dim_value")
               for value in model.graph.input if value.name not in initializers
               for dim in value.type.tensor_type.shape.dim)


@pytest.mark.parametrize("stem", BF16_SAMPLES)
def test_bfloat16_builds(line, stem):
    model, precision = model_and_precision("bf16", sample(stem))
    result = simulate(*line, model, precision)
    check_launches(result, {n.op_type for n in model.graph.node if n.domain == "trt_fusedattn"})
    assert all(launch.input_dtypes[0] == "bfloat16" for launch in result.launches)
    assert any("cast to bfloat16" in note for note in result.notes)


@pytest.mark.parametrize("path", FP8_MODELS, ids=lambda p: p.stem)
def test_fp8_conv_builds_with_quantized_weights(line, path):
    """FP8 FusedConv as ``fuse(precision="fp8")`` writes it (e4m3 W, X quantized in the kernel) writes float16 (B1),
    or e4m3 in HWC16 where it produces an FP8 chain's X (``output_scale``), and gets its FP8 weights from a
    QuantizeLinear (N1); an opset-17 export is declared opset 19 for that."""
    model, precision = model_and_precision("fp8", path)
    result = simulate(*line, model, precision)
    fp8 = [launch for launch in result.launches if launch.input_dtypes[1] == "float8_e4m3fn"]
    assert fp8 and all(launch.types[-1] == ("FP8" if launch.attrs["output_scale"] else "HALF") for launch in fp8)
    producers = [launch for launch in result.launches if launch.attrs["output_scale"]]
    assert bool(producers) == (path.stem != "vit_dynamo")  # chains but in ViT, whose one conv feeds a Reshape
    assert all(launch.formats[-1] == "HWC16" for launch in producers)
    check_launches(result, {"FusedConv"})
    assert any("QuantizeLinear" in note for note in result.notes)
    opset = next(o.version for o in model.opset_import if o.domain == "")
    assert (opset < 19) == any("declared as 19" in note for note in result.notes)


@pytest.mark.parametrize("path", FP8_ATTENTION_MODELS, ids=lambda p: p.stem)
def test_fp8_attention_builds(line, path):
    """FP8 FusedAttention as ``fuse(precision="fp8")`` writes it: e4m3 Q, K, V from QuantizeLinear nodes (N1: FP8
    exists only as a quantization's output), a float16 output (B1) and mask, the launch the direct launcher's plan
    gives; the opset-17 export is declared opset 19 for its QuantizeLinear."""
    model, precision = model_and_precision("fp8", path)
    result = simulate(*line, model, precision)
    fp8 = [launch for launch in result.launches if launch.input_dtypes[0] == "float8_e4m3fn"]
    assert len(fp8) == 2 and all(launch.input_dtypes[1:3] == ["float8_e4m3fn"] * 2 for launch in fp8)
    assert all(launch.types[-1] == "HALF" and launch.attrs["q_scale"] > 0 for launch in fp8)
    check_launches(result, {"FusedAttention"})


def test_fp8_activations_build_in_hwc16(line):
    """X already e4m3 (a QuantizeLinear's output): TensorRT's HWC16 is the channels-last format FP8 may take (B3)."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((32, 3, 3, 16)) * 0.1).astype(ml_dtypes.float8_e4m3fn)
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x8"]),
             FUSED_CONV.make_node(["x8", "w", "", "w_scale"], ["y"], pads=[1, 1, 1, 1], activation="relu",
                                  input_scale=0.05)]
    graph = helper.make_graph(
        nodes, "fp8_activations", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["n", 16, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        initializer=[numpy_helper.from_array(np.array(0.05, np.float16), "x_scale"),
                     helper.make_tensor("x_zero", TensorProto.FLOAT8E4M3FN, [], [0]),
                     numpy_helper.from_array(w, "w"),
                     numpy_helper.from_array(rng.uniform(0.5, 1, 32).astype(np.float32), "w_scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), FUSED_CONV.opset()])
    result = simulate(*line, model, None, {"n": 3})
    assert {launch.formats[0] for launch in result.launches} == {"HWC16"}
    check_launches(result, {"FusedConv"})


def test_an_empty_input_reaching_the_parser_fails_as_tensorrt_would(line, monkeypatch):
    """P3 can fail: without ``prepare_model``'s input compaction the parser hands addPluginV3 a null tensor."""
    model = fused(sample("bert_sdpa_fp16_dynamo"))
    node = next(n for n in model.graph.node if n.op_type == "FusedAttention")
    keep_empty = prepare._mark_present

    def mark_without_compacting(n):
        names = list(n.input)
        keep_empty(n)
        del n.input[:]
        n.input.extend(names + [""])

    monkeypatch.setattr(prepare, "_mark_present", mark_without_compacting)
    with pytest.raises(BuildFailure, match="P3"):
        simulate(*line, model, None)
    assert node.input  # the sample itself is untouched


def test_one_dimensional_conv_builds_as_two_dimensional(line):
    """A 1-D FusedConv (what the rewrite emits for Conv1d) reaches TensorRT as 2-D, so HWC8 vectorizes its
    channels rather than its batch (B3 needs rank >= 3; for [N, C, W] the third axis from the end is N)."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((24, 5, 16)) * 0.1).astype(np.float16)  # [K, kW, C]
    node = FUSED_CONV.make_node(["x", "w", "b", "", "r"], ["y"], pads=[2, 2], activation="gelu",
                                post_activation="relu")
    graph = helper.make_graph(
        [node], "conv1d", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["n", 16, "t"]),
                           helper.make_tensor_value_info("r", TensorProto.FLOAT16, ["n", 24, "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(rng.standard_normal(24).astype(
            np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), FUSED_CONV.opset()])
    result = simulate(*line, model, None, {"n": 2, "t": 33})
    assert all(len(launch.input_shapes[0]) == 4 and launch.formats[0] == "HWC8" for launch in result.launches)
    check_launches(result, {"FusedConv"})
    assert any("1-D convolution run as 2-D" in note for note in result.notes)


@pytest.mark.parametrize("arch, stem", OTHER_ARCHES)
def test_ampere_and_ada_builds(line, arch, stem, monkeypatch):
    """The same on building GPUs without wgmma (mma.sync kernels; sm_89 has 99 KB of shared memory a block)."""
    monkeypatch.setattr(plugins, "_building_arch", lambda: arch)
    model, precision = model_and_precision("own", sample(stem))
    check_launches(simulate(*line, model, precision), {n.op_type for n in model.graph.node
                                                       if n.domain == "trt_fusedattn"}, arch)
