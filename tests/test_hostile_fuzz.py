"""A small mutation fuzzer over the committed samples (issue 15): truncations, byte flips and overwritten
ranges, from a fixed seed, for a fixed time. Every mutant must end in exit 0 (the damage hit only weight
values), 1 (verification caught a difference, e.g. a weight turned NaN) or 2 with one error line, never an
internal error, a traceback or a crash; leave nothing but the named output; read nothing outside its folder.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from _file_audit import audited, outside, python_roots
from _pipeline_models import SAMPLES
from trt_fusedattn import cli

SEED = 15
BUDGET_S = 20.0                     # CI's 2-core machine: the loop stops after this long
VERIFY_EVERY = 4                    # one mutant in four also runs --verify (onnxruntime costs more)
FUZZED = [Path(SAMPLES) / f"{name}.onnx" for name in ("bert_sdpa_torchscript", "vit_torchscript", "resnet_torchscript")]


def mutate(data: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    """One mutant of ``data`` and a description to reproduce it."""
    kind = rng.integers(3)
    if kind == 0:
        at = int(rng.integers(1, len(data)))
        return data[:at], f"truncated at {at}"
    buf = bytearray(data)
    if kind == 1:
        spots = rng.integers(0, len(data), int(rng.integers(1, 9)))
        for spot in spots:
            buf[spot] ^= 1 << int(rng.integers(8))
        return bytes(buf), f"bits flipped at {sorted(spots.tolist())}"
    at, length = int(rng.integers(0, len(data))), int(rng.integers(1, 64))
    buf[at:at + length] = rng.integers(0, 256, len(buf[at:at + length]), dtype=np.uint8).tobytes()
    return bytes(buf), f"{length} random bytes at {at}"


def test_mutants_of_the_samples_fail_cleanly(tmp_path, capsys):
    rng = np.random.default_rng(SEED)
    originals = [p.read_bytes() for p in FUZZED]
    start, done, codes = time.monotonic(), 0, {}
    while time.monotonic() - start < BUDGET_S:
        which = int(rng.integers(len(FUZZED)))
        data, how = mutate(originals[which], rng)
        folder = tmp_path / f"m{done}"
        folder.mkdir()
        (folder / "model.onnx").write_bytes(data)
        out = folder / "out.onnx"
        args = [str(folder / "model.onnx"), "-o", str(out), "-q"] + (["--verify"] if done % VERIFY_EVERY == 0 else [])
        where = f"mutant {done} of {FUZZED[which].name} ({how}), seed {SEED}"
        capsys.readouterr()
        with audited() as audit:
            code = cli.main(args)
        err = capsys.readouterr().err
        assert code in (0, 1, 2), f"{where}: exit {code}: {err}"
        if code:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("fuse-onnx: error: "), f"{where}: {err}"
        assert sorted(os.listdir(folder)) == sorted(["model.onnx"] + (["out.onnx"] if code == 0 else [])), where
        assert not outside(audit.reads, [folder, *python_roots()]), f"{where}: read {outside(audit.reads, [folder])}"
        codes[code] = codes.get(code, 0) + 1
        done += 1
        if code == 0:
            out.unlink()
    assert done >= 10, f"only {done} mutants in {BUDGET_S} s"
    assert codes.get(2, 0) > 0, codes  # the mutations do reach the error paths
    print(f"{done} mutants: exit statuses {codes}")
