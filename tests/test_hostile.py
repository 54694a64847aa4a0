"""``fuse-onnx`` on hostile and broken inputs (issue 15): each case of ``_hostile_models`` exits with its
status and one error line, reads nothing outside the model's folder, writes nothing but the outputs named,
leaves the input files as they were, and never copies the secret beside the folder into an output.

The cases run ``cli.main`` in this process under an audit hook (fast: no interpreter start per case); the
signal, telemetry and strace tests run the installed console script in a subprocess.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from _file_audit import audited, outside, python_roots
from _hostile_models import CASES, SECRET, Case, external, mlp
from trt_fusedattn import cli, io
from trt_fusedattn.rewrites._graph import symbolic_dims


def _snapshot(folder: Path) -> dict[str, str]:
    """Relative path -> content hash (or link target / kind) of everything in a folder, without following
    links or opening special files."""
    seen = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            rel = str(path.relative_to(folder))
            if path.is_symlink():
                seen[rel] = "-> " + os.readlink(path)
            elif path.is_file():
                seen[rel] = hashlib.sha256(path.read_bytes()).hexdigest() if path.stat().st_size < 2**26 \
                    else f"sparse {path.stat().st_size}"
            else:
                seen[rel] = "dir" if path.is_dir() else "special"
    return seen


@pytest.fixture
def places(tmp_path):
    """(the model's folder, a folder beside it holding the secret the model must never reach)."""
    folder, beside = tmp_path / "model", tmp_path / "outside"
    folder.mkdir()
    beside.mkdir()
    (beside / "secret.bin").write_bytes(SECRET)
    return folder, beside


def run_case(case: Case, folder: Path, capsys):
    """Run ``fuse-onnx`` on one case under the audit; returns (exit status, stderr, audit)."""
    capsys.readouterr()
    with audited(deny=case.deny) as audit:
        try:
            code = cli.main([str(a) for a in case.args])
        except SystemExit as exit:  # argparse's usage errors
            code = exit.code
    return code, capsys.readouterr().err, audit


def assert_confined(audit, folder: Path, outputs) -> None:
    """Reads only in the model's folder (and Python's own modules); writes only the named outputs and the
    staging folders beside them."""
    strays = outside(audit.reads, [folder, *python_roots()])
    assert not strays, f"read outside the model's folder: {strays}"
    allowed = {Path(os.path.abspath(p)) for p in outputs}
    for path in audit.writes:
        staging = path if path.name.startswith(".") else path.parent
        assert path in allowed or (staging.name.startswith(".") and any(staging.parent == p.parent for p in allowed)), \
            f"wrote {path}, not a named output"


@pytest.mark.parametrize("make", CASES, ids=lambda f: f.__name__)
def test_hostile_input(make, places, capsys):
    folder, beside = places
    case = make(folder, beside)
    outputs = case.outputs or [a for flag, a in zip(case.args, case.args[1:]) if flag in ("-o", "--report",
                                                                                          "--engine")]
    before, secret_before = _snapshot(folder), _snapshot(beside)
    code, err, audit = run_case(case, folder, capsys)

    assert code == case.code, err
    lines = err.strip().splitlines()
    if case.code:
        assert len(lines) == 1 and lines[0].startswith("fuse-onnx: error: "), err
        assert case.phrase in lines[0], lines[0]
        assert _snapshot(folder) == before  # no output, no temporary file, inputs untouched
    else:
        assert lines == [], err
        after = _snapshot(folder)
        assert {k: v for k, v in after.items() if k in before and folder / k not in case.outputs} == \
            {k: v for k, v in before.items() if folder / k not in case.outputs}
        assert set(after) - set(before) <= {str(Path(p).relative_to(folder)) for p in case.outputs}
    assert_confined(audit, folder, [*outputs, *(Path(str(o) + ".data") for o in outputs)])
    assert _snapshot(beside) == secret_before
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 2**26:
            assert SECRET[:16] not in path.read_bytes(), f"the secret reached {path}"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_the_save_leaves_nothing(signum, places, capsys, monkeypatch):
    """The signal arrives while the data file is half written: exit 128+N, no output, no staging folder."""
    folder, _ = places
    path = external(mlp(), folder)
    write = io._write_external

    def write_then_signal(stubs, data_path):
        write(stubs, data_path)
        assert data_path.stat().st_size > 0 and data_path.parent.name.startswith(".")
        os.kill(os.getpid(), signum)

    monkeypatch.setattr(io, "_write_external", write_then_signal)
    before = _snapshot(folder)
    args = [path, "-o", folder / "out.onnx", "--report", folder / "r.json", "-q"]
    code, err, _ = run_case(Case(args, 0), folder, capsys)
    assert code == 128 + signum and err.strip() == (f"fuse-onnx: error: stopped by {signal.Signals(signum).name}; "
                                                    f"no partial output was left")
    assert _snapshot(folder) == before
    assert signal.getsignal(signal.SIGTERM) is not cli._stop  # handlers restored after main


def _console(*args, env=None):
    script = shutil.which("fuse-onnx") or pytest.fail("the fuse-onnx console script is not installed")
    return subprocess.Popen([script, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def test_sigterm_to_the_console_script_cleans_up(places):
    """A real SIGTERM from outside, while the tool works on a model: exit 143, nothing left behind (the
    default action of SIGTERM would have killed it with its staging folder in place)."""
    folder, _ = places
    path = external(mlp(), folder)
    before = _snapshot(folder)
    # The child pauses in the middle of writing the data file, so the signal lands there.
    code = (f"import os, signal, sys; from trt_fusedattn import io, cli\n"
            f"write = io._write_external\n"
            f"def slow(stubs, data_path):\n"
            f"    write(stubs, data_path); print('writing', flush=True); signal.pause()\n"
            f"io._write_external = slow\n"
            f"sys.exit(cli.main({[str(path), '-o', str(folder / 'out.onnx'), '-q']!r}))\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing"
    assert any(p.name.startswith(".out.onnx.") for p in folder.iterdir())  # the staging folder exists now
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 143, err
    assert err.strip() == "fuse-onnx: error: stopped by SIGTERM; no partial output was left"
    assert _snapshot(folder) == before


_CI_SWITCHES = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TF_BUILD", "ORT_RUNNING_UNIT_TESTS",
                "ORT_DISABLE_TELEMETRY", cli.ALLOW_TELEMETRY)


def test_dependency_telemetry_is_off_unless_allowed(places, tmp_path):
    """onnxruntime writes a device id under ~/.cache at import and uploads events; the CLI switches that off.
    CI variables (which onnxruntime also obeys) are cleared so the test sees the default a user gets."""
    folder, _ = places
    path = folder / "model.onnx"
    onnx.save(mlp(), path)
    env = {k: v for k, v in os.environ.items() if k not in _CI_SWITCHES}
    homes = {}
    for allowed in (True, False):
        home = tmp_path / f"home_{allowed}"
        home.mkdir()
        run_env = dict(env, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
                       **({cli.ALLOW_TELEMETRY: "1"} if allowed else {}))
        child = _console(path, "-o", folder / f"out_{allowed}.onnx", "--verify", "-q", env=run_env)
        _, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        homes[allowed] = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    if not homes[True]:
        pytest.skip("this onnxruntime writes nothing under HOME even when allowed: no telemetry to switch off")
    assert homes[False] == [], f"with telemetry off, files appeared under HOME: {homes[False]}"


_SYSTEM = ("/usr/", "/lib", "/etc/ld.so", "/proc/self/", "/proc/cpuinfo", "/sys/", "/dev/", "/etc/localtime",
           "/proc/meminfo", "/proc/stat", "/etc/nsswitch.conf")


@pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed: the C-level check needs it")
@pytest.mark.parametrize("location", ["../outside/secret.bin", "/proc/self/environ", "weights.bin"])
def test_no_file_outside_the_model_folder_is_opened_even_by_libraries(location, places, tmp_path):
    """Every open(2) of the whole process tree (onnx's and onnxruntime's C++ included), for a hostile and
    a well-formed model with external data under --verify: the secret is never opened, nor anything else
    under the test's folder but the model's folder."""
    folder, beside = places
    path = external(mlp(), folder, location=location)
    log = tmp_path / "strace.log"
    script = shutil.which("fuse-onnx")
    result = subprocess.run(["strace", "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", str(log), script,
                             str(path), "-o", str(folder / "out.onnx"), "--verify", "-q"],
                            capture_output=True, text=True, timeout=300)
    if "ptrace" in result.stderr and "Operation not permitted" in result.stderr:
        pytest.skip("strace cannot trace here (ptrace not permitted)")
    assert result.returncode == (0 if location == "weights.bin" else 2), result.stderr
    opened = set()
    for line in log.read_text().splitlines():
        if '"' in line and "ENOENT" not in line:
            opened.add(Path(os.path.abspath(line.split('"')[1])))
    assert opened, "strace saw no open at all"
    assert not [p for p in opened if p.is_relative_to(beside)], "the secret's folder was opened"
    if location != "weights.bin":  # refused before onnxruntime loads (which reads its own environment)
        assert Path("/proc/self/environ") not in opened
    strays = [p for p in outside(opened, [folder, *python_roots()]) if not str(p).startswith(_SYSTEM)]
    assert not strays, f"opened outside the model's folder: {strays}"


def test_report_and_model_are_written_together_or_not_at_all(places, capsys, monkeypatch):
    """The report is put in place first; when that fails, the model is not published either."""
    folder, _ = places
    path = folder / "model.onnx"
    onnx.save(mlp(), path)
    publish = io.Staged.publish

    def report_fails(self):
        if self.target.suffix == ".json":
            self.discard()
            raise io.InputError(f"{self.target}: could not be written (No space left on device)")
        return publish(self)

    monkeypatch.setattr(io.Staged, "publish", report_fails)
    before = _snapshot(folder)
    code, err, _ = run_case(Case([path, "-o", folder / "out.onnx", "--report", folder / "r.json", "-q"], 0), folder,
                            capsys)
    assert code == 2 and "r.json: could not be written" in err
    assert _snapshot(folder) == before
    monkeypatch.setattr(io.Staged, "publish", publish)
    code, err, _ = run_case(Case([path, "-o", folder / "out.onnx", "--report", folder / "r.json", "-q"], 0), folder,
                            capsys)
    assert code == 0 and {"out.onnx", "r.json"} <= set(os.listdir(folder)), err



def test_shape_inference_that_gives_up_writes_nothing(tmp_path, monkeypatch):
    # onnxruntime's symbolic shape inference saves a partial model (sym_shape_infer_temp.onnx + data files) in the
    # working directory when it cannot finish (here: an op of an unknown domain); the rewrites run it on demand
    monkeypatch.chdir(tmp_path)
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 8])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 8])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Mystery", ["x"], ["m"], domain="acme"),
                                    onnx.helper.make_node("Relu", ["m"], ["y"])], "g", [x], [y])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                         onnx.helper.make_opsetid("acme", 1)])
    with audited() as audit:
        assert symbolic_dims(model) == {}
    assert list(tmp_path.iterdir()) == [] and not audit.writes
    model.graph.node[0].CopyFrom(onnx.helper.make_node("Neg", ["x"], ["m"]))
    assert symbolic_dims(model)["y"] == ["batch", 8]  # the same inference, finished, still answers
