"""Verification: the error measure, the onnxruntime bridge for custom nodes (dtypes, optional inputs,
pluggable implementations), and random inputs."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto

from _pipeline_models import fused_attention, standard_attention
from trt_fusedattn.errors import VerificationError
from trt_fusedattn.ort_session import implementation_key, run_model
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION, fused_attention_reference
from trt_fusedattn.random_inputs import random_inputs
from trt_fusedattn.verification import compare, verify


def test_relative_error_is_max_abs_over_max_magnitude_of_the_original():
    want = np.array([[4.0, -1.0], [0.5, 0.0]], np.float32)
    got = want + np.array([[0.0, 0.002], [0.0, -0.001]], np.float32)
    check = compare("y", got, want)
    assert check.max_abs == pytest.approx(0.002, rel=1e-4)
    assert check.max_rel == pytest.approx(0.002 / 4.0, rel=1e-4)
    assert check.rtol == 1e-4 and not check.passed
    assert compare("y", got, want, rtol=1e-3).passed
    assert compare("y", got, want, rtol=0.0, atol=0.0021).passed


def test_default_tolerance_follows_dtype_and_integers_must_match():
    assert compare("y", np.ones(3, np.float16), np.ones(3, np.float16)).rtol == 1e-2
    assert compare("y", np.ones(3, ml_dtypes.bfloat16), np.ones(3, ml_dtypes.bfloat16)).rtol == 2e-2
    assert not compare("i", np.array([1, 2, 4]), np.array([1, 2, 3])).passed
    assert compare("i", np.array([1, 2, 3]), np.array([1, 2, 3])).passed


def test_nan_on_one_side_and_shape_mismatch_fail():
    want = np.array([1.0, np.nan, 2.0])
    assert compare("y", want.copy(), want).passed  # NaN where the original has NaN is agreement
    assert not compare("y", np.array([1.0, 0.0, 2.0]), want).passed
    assert not compare("y", np.array([np.nan, np.nan, 2.0]), want).passed
    assert not compare("y", np.ones((2, 3)), np.ones((3, 2))).passed


def test_fused_attention_matches_standard_ops_and_a_wrong_kernel_is_caught():
    original, fused = standard_attention(), fused_attention()
    result = verify(original, fused, seed=5)
    assert result.passed and result.outputs[0].max_rel < 1e-5
    assert result.inputs["q"] == [2, 2, 17, 8] and result.inputs["k"] == [2, 2, 17, 8]

    def off_by_a_little(*args, **attrs):
        return (fused_attention_reference(*args, **attrs) * 1.001).astype(np.float32)

    wrong = verify(original, fused, seed=5, implementations={FUSED_ATTENTION: off_by_a_little})
    assert not wrong.passed and 5e-4 < wrong.outputs[0].max_rel < 2e-3
    with pytest.raises(VerificationError, match="output 'o' max relative error"):
        wrong.raise_if_failed()


@pytest.mark.parametrize("mask_dtype,key_lengths", [(None, False), (TensorProto.BOOL, True),
                                                    (TensorProto.FLOAT16, False), (None, True)])
def test_custom_node_gets_its_own_dtypes_and_none_for_missing_inputs(mask_dtype, key_lengths):
    model = fused_attention(TensorProto.FLOAT16, mask_dtype, key_lengths)
    feeds = random_inputs(model, seed=1)
    if mask_dtype == TensorProto.BOOL:
        feeds["mask"] = np.random.default_rng(2).random(feeds["mask"].shape) < 0.8
    if key_lengths:
        feeds["key_lengths"] = np.array([17, 9], np.int32)
    seen = []

    def recording(q, k, v, mask, key_lengths, **attrs):
        seen.append(([None if a is None else a.dtype for a in (q, k, v, mask, key_lengths)], attrs))
        return fused_attention_reference(q, k, v, mask, key_lengths, **attrs)

    out = run_model(model, feeds, {"FusedAttention": recording})["o"]
    (dtypes, attrs), = seen
    assert dtypes[:3] == [np.float16] * 3
    assert dtypes[3] == (None if mask_dtype is None else onnx.helper.tensor_dtype_to_np_dtype(mask_dtype))
    assert dtypes[4] == (np.int32 if key_lengths else None)
    assert attrs == FUSED_ATTENTION.resolve({"layout": "BHSD", "scale": 0.25})  # the node's, defaults filled in
    assert attrs["layout"] == "BHSD" and attrs["scale"] == 0.25 and attrs["causal"] == 0
    expected = fused_attention_reference(*(feeds.get(n) for n in ("q", "k", "v", "mask", "key_lengths")), **attrs)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, expected)  # carried through float32 and back: bit for bit


def test_bfloat16_custom_node_runs_on_the_reference_exactly():
    model = fused_attention(TensorProto.BFLOAT16, causal=1)
    feeds = random_inputs(model, seed=4, dims={"seq": 5, "kv_seq": 7})
    assert feeds["q"].dtype == ml_dtypes.bfloat16 and feeds["q"].shape == (2, 2, 5, 8)
    out = run_model(model, feeds)["o"]
    expected = fused_attention_reference(feeds["q"], feeds["k"], feeds["v"], layout="BHSD", scale=0.25, causal=1)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out.astype(np.float32), expected.astype(np.float32))


def test_implementation_keys():
    qualified = "trt_fusedattn::FusedAttention"
    assert implementation_key(FUSED_ATTENTION) == implementation_key("FusedAttention") == qualified
    with pytest.raises(ValueError, match="no custom op"):
        implementation_key("FusedSoftmax")


def test_random_inputs_pad_masks_index_tables_and_share_dims():
    model = onnx.load("models/samples/bert_sdpa_torchscript.onnx")
    feeds = random_inputs(model, seed=0)
    vocab = next(t.dims[0] for t in model.graph.initializer if "word_embeddings" in t.name)
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    assert ids.shape == mask.shape == (2, 17)
    assert ids.max() < vocab and ids.max() > vocab // 2  # spread over the whole vocabulary
    # every row starts attended and ends padded (no row fully masked under either padding convention), rows differ
    assert (mask[:, 0] == 1).all() and (mask[:, -1] == 0).all() and mask[0].sum() != mask[1].sum()
    assert random_inputs(model, seed=0, dims={"seq": 40})["input_ids"].shape == (2, 40)
    assert not np.array_equal(random_inputs(model, seed=1)["input_ids"], ids)
    np.testing.assert_array_equal(random_inputs(model, seed=0)["input_ids"], ids)


def test_an_exception_inside_a_custom_node_is_a_one_line_error_not_an_abort():
    """onnxruntime-extensions aborts the process when a Python op raises: the bridge keeps the exception."""
    from trt_fusedattn.errors import FuseError

    model = fused_attention()
    feeds = random_inputs(model, seed=3)

    def broken(*args, **attrs):
        raise RuntimeError("kernel launch failed\nsecond line")

    with pytest.raises(FuseError, match="a custom node failed: .*RuntimeError: kernel launch failed") as err:
        run_model(model, feeds, {"FusedAttention": broken})
    assert "\n" not in str(err.value)
    np.testing.assert_array_equal(run_model(model, feeds)["o"], run_model(model, feeds)["o"])  # still usable


def test_random_inputs_check_sizes_before_allocating():
    from trt_fusedattn.errors import InputError

    model = standard_attention()
    with pytest.raises(InputError, match="no dimension of that name .*batch, kv_seq, seq"):
        random_inputs(model, dims={"sequence": 8})
    with pytest.raises(InputError, match="over the 1 GiB limit; give smaller sizes with --dim"):
        random_inputs(model, dims={"seq": 2**26})
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 0  # a static 0 is kept, not taken as unknown
    assert random_inputs(model, seed=0)["q"].shape == (2, 2, 0, 8)


def test_strings_compare_exactly():
    want = np.array(["a", "b"], object)
    assert compare("s", np.array(["a", "b"], object), want).passed
    assert not compare("s", np.array(["a", "c"], object), want).passed
    assert not compare("s", None, want).passed


@pytest.mark.parametrize("make,shape", [("baked_sequence", [8, 2, 8]), ("long_receptive_field", [2, 1, 64])])
def test_sizes_are_searched_when_the_original_does_not_run_at_the_defaults(make, shape):
    import _size_models

    model = getattr(_size_models, make)()
    with pytest.raises(Exception, match="onnxruntime failed to run the model"):
        run_model(model, random_inputs(model, seed=0))  # the defaults really fail
    result = verify(model, model, seed=0)
    assert result.passed and result.inputs["x"] == shape, result.table()
    assert "the original does not run at x[" in result.how and "verified at" in result.how
    assert result.outputs[0].max_abs == 0.0 and result.outputs[0].shape  # compared on real outputs


def test_a_model_that_runs_at_no_size_says_what_failed_and_what_to_pass():
    from _size_models import baked_sequence, runs_at_no_size
    from trt_fusedattn.errors import InputError

    result = verify(runs_at_no_size(), runs_at_no_size(), seed=0)
    assert not result.passed and result.outputs == []
    with pytest.raises(InputError) as err:
        result.raise_if_failed()
    message = str(err.value)
    assert "\n" not in message and message.startswith("the original model (not the fusion) does not run")
    assert "x[2x17x16]" in message and "other sizes tried" in message and "--dim NAME=SIZE" in message
    assert "batch, seq" in message
    given = verify(baked_sequence(), baked_sequence(), seed=0, dims={"seq": 17, "batch": 2})
    assert given.original_error and "other sizes" not in given.original_error  # the user's sizes are kept


def test_onnx_attention_that_onnxruntime_refuses_runs_the_onnx_reference_on_both_sides():
    from _size_models import onnx_attention_with_key_mask
    from trt_fusedattn.ort_session import RunFailed

    model = onnx_attention_with_key_mask()
    feeds = random_inputs(model, seed=2)
    with pytest.raises(RunFailed, match="running Attention node"):
        run_model(model, feeds)  # onnxruntime's own kernel refuses the [B, 1, 1, L] mask
    out = run_model(model, feeds, reference_ops=("Attention",))["y"]
    mask = feeds["attention_mask"][:, :, 0, :]  # [B, 1, L]: keys allowed per batch
    scores = np.einsum("bhqd,bhkd->bhqk", feeds["q"], feeds["k"]).astype(np.float64) * 0.25
    scores = np.where(mask[:, :, None, :], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    expected = np.einsum("bhqk,bhkd->bhqd", probs / probs.sum(-1, keepdims=True), feeds["v"])
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    result = verify(model, model, seed=2)
    assert result.passed and "ONNX Attention nodes ran onnx's reference implementation" in result.how
