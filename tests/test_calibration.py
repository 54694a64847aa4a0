"""FP8 calibration: amax observers (max, percentile), calibration sources (random:N, .npz), scales, and the
amax recorded from a model run under onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

from trt_fusedattn.calibration import (E4M3_MAX, Amax, Method, calibration_batches, channel_scales, parse_method,
                                       parse_source, quantize_weights, record_amax)
from trt_fusedattn.errors import InputError

import _conv_graphs as graphs


def test_max_is_the_largest_magnitude_over_batches():
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal((4, 50)) * s for s in (1.0, 3.0, 0.5)]
    observer = Amax(Method("max"))
    for batch in batches:
        observer.add(batch)
    assert observer.value() == max(np.abs(b).max() for b in batches)


@pytest.mark.parametrize("p", [99.0, 99.9, 50.0])
def test_percentile_matches_numpy_within_a_bin_across_range_growth(p):
    """Batches of growing magnitude double the histogram's range several times; the answer stays within one
    bin (range / 2048) of numpy's percentile of all values seen."""
    rng = np.random.default_rng(7)
    batches = [rng.standard_normal(20_000) * s for s in (0.1, 1.0, 8.0)]
    observer = Amax(Method("percentile", p))
    for batch in batches:
        observer.add(batch)
    want = np.percentile(np.abs(np.concatenate(batches)), p)
    assert abs(observer.value() - want) <= observer.range / 2048 * 1.01
    assert observer.value() <= observer.max


def test_percentile_ignores_outliers_that_max_takes():
    x = np.concatenate([np.random.default_rng(1).uniform(-1, 1, 100_000), [1000.0]])
    by_max, by_percentile = Amax(Method("max")), Amax(Method("percentile", 99.9))
    by_max.add(x)
    by_percentile.add(x)
    assert by_max.value() == 1000.0 and by_percentile.value() < 2.0


def test_methods_parse_and_bad_ones_say_what_to_give():
    assert parse_method("max") == Method("max")
    assert parse_method("percentile:99.9") == Method("percentile", 99.9)
    for text in ("mean", "percentile:0", "percentile:abc", "max:3"):
        with pytest.raises(InputError, match="--calib-method"):
            parse_method(text)


def test_sources_parse(tmp_path):
    assert parse_source("random:4") == 4
    path = tmp_path / "s.npz"
    np.savez(path, x=np.ones(3))
    assert parse_source(str(path)) == str(path)
    for text in ("random:0", "random:x", str(tmp_path / "missing.npz")):
        with pytest.raises(InputError, match="--calib"):
            parse_source(text)


def test_channel_scales_put_each_channel_amax_on_448():
    w = np.random.default_rng(2).standard_normal((6, 3, 3, 4)) * np.arange(1, 7).reshape(6, 1, 1, 1)
    scales = channel_scales(w)
    q = quantize_weights(w, scales).astype(np.float64)
    assert np.allclose(np.abs(q).reshape(6, -1).max(axis=1), E4M3_MAX)
    rel = np.abs(q * scales.reshape(-1, 1, 1, 1) - w).max() / np.abs(w).max()
    assert 0 < rel <= 2.0 ** -4  # e4m3 rounds to 3 mantissa bits
    assert channel_scales(np.zeros((2, 3)))[0] == 1.0


def test_npz_batches_stacked_or_single_and_mismatches_refused(tmp_path):
    model = graphs.conv_case()
    stacked = np.random.default_rng(0).standard_normal((3, 2, 4, 9, 9)).astype(np.float32)
    np.savez(tmp_path / "stack.npz", x=stacked)
    batches = calibration_batches(model, str(tmp_path / "stack.npz"))
    assert len(batches) == 3 and np.array_equal(batches[1]["x"], stacked[1])
    np.savez(tmp_path / "one.npz", x=stacked[0])
    assert len(calibration_batches(model, str(tmp_path / "one.npz"))) == 1
    np.savez(tmp_path / "wrong.npz", y=stacked[0])
    with pytest.raises(InputError, match="do not match the model's inputs"):
        calibration_batches(model, str(tmp_path / "wrong.npz"))


def test_random_batches_are_not_verification_inputs():
    model = graphs.conv_case()
    batches = calibration_batches(model, 3)
    from trt_fusedattn.random_inputs import random_inputs

    assert len(batches) == 3 and not any(np.array_equal(b["x"], random_inputs(model, seed=0)["x"]) for b in batches)


def test_record_amax_reads_intermediate_tensors():
    """The amax of the Conv's output equals the max of that tensor computed directly by onnxruntime."""
    from trt_fusedattn.ort_session import run_model

    model = graphs.activation_case("relu")
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    batches = calibration_batches(model, 2)
    amax = record_amax(model, [relu.input[0], "x"], batches)
    direct = max(np.abs(run_model(model, b)[model.graph.output[0].name]).max() for b in batches)
    assert amax[relu.input[0]] >= direct > 0  # relu(conv) <= |conv|, equal where the max is positive
    assert amax["x"] == max(np.abs(b["x"]).max() for b in batches)


def test_progress_bar_on_stderr_unless_quiet(capsys):
    model = graphs.conv_case()
    record_amax(model, ["x"], calibration_batches(model, 2), quiet=False)
    err = capsys.readouterr().err
    assert "calibrating" in err and "2/2" in err
    record_amax(model, ["x"], calibration_batches(model, 2), quiet=True)
    assert capsys.readouterr().err == ""
