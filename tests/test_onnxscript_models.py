"""The real-model graphs onnxscript's own rewriter is tested on (``onnxscript.rewriter.models``, issue 14): every
attention site and conv fused in under 5 s of rewrite and verified at the default tolerances.

Their weights are Constant nodes, literals CastLike, and the decoders carry KV caches and rotary embeddings;
they hold 0.1-1.3 GB of weights, so each test builds one model and drops it (Phi-2 peaks at ~8.5 GB while
onnxruntime holds it), smallest first. Their ``make_model_with_random_weights`` draws every weight from
rand() in [0, 1): in SmolLM and Phi-2 the attention scores are then in the thousands and each softmax row is
one-hot, so the fused and original outputs agree exactly (or to 1e-7) and the check sees only which key wins.
Those three are verified again with weights of the usual scale (normal over sqrt(fan-in), norms ~1), where
the probabilities are spread: there scores 10% off fail."""
from __future__ import annotations

import ctypes
import gc
import importlib
import math
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trt_fusedattn.errors import InputError
from trt_fusedattn.pipeline import fuse
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION, fused_attention_reference
from trt_fusedattn.random_inputs import check_dim_names, random_inputs
from trt_fusedattn.verification import verify

# module -> families of its sites, smallest model first
MODELS = {"_bart_encoder": {"attention"}, "_whisper_encoder": {"attention", "conv"},
          "_whisper_decoder": {"attention"}, "_smollm_1": {"attention"}, "_smollm_2": {"attention"},
          "_phi2lm": {"attention"}}
SATURATED = ("_smollm_1", "_smollm_2", "_phi2lm")  # rand() weights make every softmax row one-hot


@pytest.fixture(autouse=True)
def _memory_given_back():
    """After each model, hand the freed heap back to the system: glibc keeps it otherwise, and the next model's
    peak lands on top (Phi-2 after the others: 13.5 GB in one process, 8.5 GB alone)."""
    yield
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: nothing to trim
        pass


def _make(name: str) -> onnx.ModelProto:
    models = pytest.importorskip("onnxscript.rewriter.models", reason="onnxscript's rewriter test models")
    return importlib.import_module(f"{models.__name__}.{name}").make_model_with_random_weights()


def _fused_timed(original: onnx.ModelProto, families: set) -> onnx.ModelProto:
    start = time.process_time()  # CPU time of this process: the rewrite's own cost, not other jobs on a loaded machine
    fused, report = fuse(original)
    seconds = time.process_time() - start
    assert report.sites and all(s.fused for s in report.sites), [(s.anchor, s.reason) for s in report.sites]
    assert {s.family for s in report.sites} == families
    assert seconds < 5.0, f"rewrite took {seconds:.1f} s"
    return fused


@pytest.mark.parametrize("name", list(MODELS))
def test_every_site_fused_in_under_5_s_and_verified(name):
    original = _make(name)
    fused = _fused_timed(original, MODELS[name])
    result = verify(original, fused)
    assert result.passed, result.table()
    if name == "_whisper_encoder":  # activations ~1e3: the float32 original's own error exceeds 1e-4 / 2
        assert "float64 evaluation" in result.how and result.outputs[0].rtol > 1e-4


def _usual_scale_rand(rng):
    """numpy.random.rand's signature, drawing weights of a trained model's scale instead of [0, 1)."""
    def rand(*shape):
        if len(shape) <= 1:  # norm weights and biases
            return np.asarray(1.0 + 0.1 * rng.standard_normal(shape))
        fan_in = math.prod(shape) // max(shape)  # [out, in], [in, out] and [out, in, k] alike
        return rng.standard_normal(shape) / math.sqrt(fan_in)
    return rand


@pytest.mark.parametrize("name", SATURATED)
def test_decoders_verified_where_the_softmax_is_not_one_hot(name, monkeypatch):
    monkeypatch.setattr(np.random, "rand", _usual_scale_rand(np.random.default_rng(0)))
    original = _make(name)
    fused = _fused_timed(original, MODELS[name])
    result = verify(original, fused, seed=1)
    assert result.passed, result.table()

    def sharper(q, *args, **attrs):  # scores 10% too large: invisible where every softmax row is one-hot
        return fused_attention_reference((q * 1.1).astype(q.dtype), *args, **attrs)

    wrong = verify(original, fused, seed=1, implementations={FUSED_ATTENTION: sharper})
    assert not wrong.passed, wrong.table()  # here the probabilities reach the outputs


def test_a_wrong_attention_fails_beside_the_float32_error_allowance():
    """The Whisper encoder passes on the original's float32 error (rtol 1e-4 + 2e); an attention off by 1%
    still fails."""
    original = _make("_whisper_encoder")
    fused, _ = fuse(original)

    def one_percent_off(*args, **attrs):
        return (fused_attention_reference(*args, **attrs) * 1.01).astype(np.float32)

    wrong = verify(original, fused, implementations={FUSED_ATTENTION: one_percent_off})
    assert not wrong.passed and wrong.outputs[0].max_rel > 10 * wrong.outputs[0].rtol, wrong.table()


def _cancelling(big: float) -> onnx.ModelProto:
    """y = (x + big) - big: in float32 x is rounded to a multiple of big's spacing, in float64 it survives."""
    nodes = [helper.make_node("Constant", [], ["big"], value=helper.make_tensor("big", TensorProto.FLOAT, [], [big])),
             helper.make_node("Add", ["x", "big"], ["xb"]), helper.make_node("Sub", ["xb", "big"], ["y"])]
    graph = helper.make_graph(nodes, "cancel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_original_unstable_in_float32_excuses_nothing():
    """x + 2^16 - 2^16 rounds x in [-2.5, 2.5] to steps of 2^-7 in float32: 1.6e-3 of its largest magnitude
    from float64, over 10x rtol, so no allowance; the exact model (Identity) fails against it, saying why."""
    exact = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "exact", _cancelling(1.0).graph.input,
        _cancelling(1.0).graph.output), opset_imports=[helper.make_opsetid("", 17)])
    x = {"x": np.linspace(-2.5, 2.5, 256, dtype=np.float32).reshape(4, 64)}
    result = verify(_cancelling(2.0**16), exact, inputs=x)
    assert not result.passed and "unstable" in result.how and result.outputs[0].rtol == 1e-4, result.table()
    assert verify(_cancelling(1.0), exact, inputs=x).passed  # 1 + x - 1: float32 rounding of x alone


def _kv_cache_inputs() -> onnx.ModelProto:
    """Phi-2's input shapes as torch.export names them: the mask spans past + new tokens, 's16 + s62'."""
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["s34", "s16"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["s34", "s16 + s62"]),
              helper.make_tensor_value_info("past_key", TensorProto.FLOAT, ["s34", 32, "s62", 80]),
              helper.make_tensor_value_info("other", TensorProto.FLOAT, ["seq-len", "2*s16"])]
    graph = helper.make_graph([helper.make_node("Identity", ["past_key"], ["y"])], "kv", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph)


def test_a_dim_named_as_a_sum_of_dims_takes_their_value():
    model = _kv_cache_inputs()
    shapes = {k: v.shape for k, v in random_inputs(model, dims={"s62": 5, "s16": 3}).items()}
    assert shapes["attention_mask"] == (2, 8) and shapes["past_key"] == (2, 32, 5, 80)
    assert shapes["other"] == (17, 6)  # 'seq-len' names no dims: a plain name
    with pytest.raises(InputError, match="computed from the others"):
        check_dim_names(model, {"s16 + s62": 9})
