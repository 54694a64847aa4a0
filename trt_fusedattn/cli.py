"""``fuse-onnx``: rewrite a model's attention and convolution subgraphs into our custom ops, verify, save,
and (with TensorRT's builder) build an engine.

Exit status: 0 done; 1 the fused model failed verification; 2 bad usage or input; 3 an engine was asked for
and TensorRT's builder is missing; 70 an internal error (a bug: rerun with --debug for the traceback);
128 + the signal's number when stopped by SIGINT, SIGTERM or SIGHUP (nothing half-written is left).
Progress goes to stderr, the report table to stdout. Models are untrusted input: nothing outside the paths
the user named (the model, its data files in its folder, the outputs) is read or written, and the
telemetry of dependencies is off unless FUSE_ONNX_ALLOW_TELEMETRY=1.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from trt_fusedattn.errors import FuseError, InputError, TensorRTUnavailable
from trt_fusedattn.tensorrt import PRECISIONS

ALLOW_TELEMETRY = "FUSE_ONNX_ALLOW_TELEMETRY"
_LARGE = 256 * 2**20  # bytes of model file from which loading is announced before it starts
_MAX_DIM = 2**31 - 1  # largest size a --dim may give (ONNX runtimes index dims with int32 in places)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line, as every other error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite tolerance >= 0 (e.g. 1e-3)")
    return value


def _seed(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,18}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed (an integer from 0 to 10^18)")
    return int(text)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="fuse-onnx",
        description="Fuse attention and convolution subgraphs of an ONNX model into trt_fusedattn custom ops "
                    "(FusedAttention, FusedConv), verify against the original, and optionally build a TensorRT engine.",
        epilog="exit status: 0 done (also with nothing to fuse), 1 verification failed, 2 bad usage or input, "
               "3 --engine without TensorRT's builder, 70 internal error, 128+N stopped by signal N. "
               f"Telemetry of dependencies (onnxruntime) is off; {ALLOW_TELEMETRY}=1 allows it.")
    p.add_argument("model", help="the .onnx model (external data files beside it)")
    p.add_argument("-o", "--output", help="fused model path (default: MODEL.fused.onnx beside the input)")
    p.add_argument("--only", metavar="FAMILIES", help="comma-separated rewrite families to run: attention,conv")
    p.add_argument("--verify", action="store_true",
                   help="run original and fused model under onnxruntime on random inputs and compare outputs")
    p.add_argument("--rtol", type=_tolerance, help="relative tolerance, max|fused-original| / max|original| (default "
                                              "by dtype: 1e-4 fp32, 1e-2 fp16, 2e-2 bf16; 0.25 with FP8 nodes)")
    p.add_argument("--atol", type=_tolerance, default=0.0, help="absolute tolerance; an output passes within either")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the random verification inputs")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a named dynamic input dimension for verification (repeatable)")
    p.add_argument("--report", metavar="JSON", help="write the report (sites, verification) as JSON")
    p.add_argument("--engine", metavar="PATH", help="build a TensorRT engine of the fused model (needs TensorRT)")
    p.add_argument("--target", metavar="ARCH",
                   help="GPU arch the engine is for (e.g. sm_90a): convs and attention sites that TensorRT's own "
                        "fusion runs faster there are left to it (default: every site fused; with --engine, this "
                        "GPU's arch)")
    precision = p.add_mutually_exclusive_group()
    for name in [precision for precision in PRECISIONS if precision != "fp32"]:
        precision.add_argument(f"--{name}", dest="precision", action="store_const", const=name,
                               help=f"our custom nodes compute in {name.upper()}: float32 ones get Casts around them "
                                    "(the engine is strongly typed: other layers keep the model's dtypes)")
    precision.add_argument("--precision", choices=[p for p in PRECISIONS if p != "fp32"],
                           help="the same as --fp16/--bf16/--fp8; fp8 also without --engine: every FusedConv and "
                                "FusedAttention with an FP8 kernel becomes FP8, scales calibrated with --calib (a Q/DQ "
                                "model's sites are FP8 from its own scales whatever the precision)")
    p.add_argument("--calib", metavar="SOURCE", help="FP8 calibration inputs: an .npz of arrays named after the inputs "
                                                     "(one more leading axis = several samples) or random:N "
                                                     "(default random:16: say which with real data)")
    p.add_argument("--calib-method", metavar="METHOD", default="max",
                   help="FP8 amax of activations: max (default), percentile or percentile:P (default P 99.99)")
    p.add_argument("--fp8-rotate-qk", action="store_true",
                   help="calibrated FP8 attention quantizes Q and K after a Hadamard rotation (FlashAttention-3's "
                        "incoherent processing): lower error where Q/K have outlier channels; folded into the Q/K "
                        "projections where they feed the site directly, else two head dim x head dim MatMuls per "
                        "site (needs --precision fp8)")
    p.add_argument("--no-fp8-chains", dest="fp8_chains", action="store_false",
                   help="FP8 convs write float16 even where only FP8 convs read their output (default: they write "
                        "e4m3 for them, so no quantize runs between)")
    p.add_argument("--shapes", action="append", default=[], metavar="NAME:MIN/OPT/MAX",
                   help="optimization profile of a dynamic engine input, dims joined by x, e.g. "
                        "input_ids:1x8/4x128/8x512 (repeatable; NAME:SHAPE fixes it)")
    p.add_argument("--timing-cache", metavar="PATH",
                   help="TensorRT timing cache file: read when it exists, written after the build (faster rebuilds)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines and no table")
    p.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    return p


class _Progress:
    """Progress on stderr: a line when a step ends (so bad input gives the error line alone), and one when a
    long step begins."""

    def __init__(self, quiet: bool):
        self.quiet, self.start = quiet, time.perf_counter()

    def begin(self, announce: str | None = None) -> None:
        self.start = time.perf_counter()
        if announce and not self.quiet:
            print(f"fuse-onnx: {announce} ...", file=sys.stderr, flush=True)

    def end(self, message: str) -> None:
        if not self.quiet:
            print(f"fuse-onnx: {message} in {time.perf_counter() - self.start:.2f} s", file=sys.stderr, flush=True)


def _dims(items: list[str]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, _, size = item.partition("=")
        if not name or not re.fullmatch(r"[0-9]{1,10}", size) or int(size) > _MAX_DIM:
            raise InputError(f"--dim {item[:80]!r}: expected NAME=SIZE with a size from 0 to {_MAX_DIM}, "
                             f"e.g. --dim sequence_length=64")
        if dims.get(name, int(size)) != int(size):
            raise InputError(f"--dim {name} is given twice with different sizes; give it once")
        dims[name] = int(size)
    return dims


def _families(only: str | None) -> list[str] | None:
    if only is None:
        return None
    families = [f.strip() for f in only.split(",") if f.strip()]
    if not families:
        from trt_fusedattn.rewrites import FAMILIES

        raise InputError(f"--only {only!r} names no rewrite family; choose from {', '.join(FAMILIES)}")
    return families


def _check_targets(targets: dict[str, Path], inputs) -> None:
    """No output names an input file (the model, its data files), nor the same file as another output."""
    from trt_fusedattn.io import same_file

    for flag, target in targets.items():
        for source in inputs:
            if same_file(target, source):
                raise InputError(f"{flag} {target}: is a file the input model reads ({Path(source).name}); "
                                 f"writing it would change the input, choose another path")
    names = list(targets.items())
    for i, (flag, target) in enumerate(names):
        for other_flag, other in names[i + 1:]:
            if same_file(target, other):
                raise InputError(f"{flag} and {other_flag} name the same file ({target}); give each its own path")


def _local_arch() -> str | None:
    """This machine's GPU arch (the one --engine builds for), or None without a visible GPU."""
    try:
        from trt_fusedattn.launcher.launch import device_arch

        return device_arch(0)
    except Exception:  # noqa: BLE001 - no driver, no cuda-python, no device: all mean "no GPU to target"
        return None


def run(args: argparse.Namespace) -> int:
    from trt_fusedattn import io, pipeline
    from trt_fusedattn import tensorrt as trt_layer
    from trt_fusedattn.random_inputs import check_dim_names

    progress = _Progress(args.quiet)
    only = _families(args.only)
    pipeline.check_families(only)
    pipeline.check_target(args.target)
    dims = _dims(args.dim)
    if args.precision not in (None, "fp8") and not args.engine:
        raise InputError(f"--{args.precision} chooses the engine's precision; add --engine PATH or leave it out")
    if (args.calib or args.calib_method != "max" or args.fp8_rotate_qk) and args.precision != "fp8":
        raise InputError("--calib, --calib-method and --fp8-rotate-qk shape FP8 calibration; add --precision fp8 or "
                         "leave them out")
    from trt_fusedattn.calibration import DEFAULT_SOURCE, parse_method, parse_source

    calibration = parse_source(args.calib or DEFAULT_SOURCE)
    calib_method = parse_method(args.calib_method)
    for flag, given in (("--shapes", args.shapes), ("--timing-cache", args.timing_cache)):
        if given and not args.engine:
            raise InputError(f"{flag} is an engine-build option; add --engine PATH or leave it out")
    try:
        shapes = trt_layer.parse_shapes(args.shapes) if args.shapes else None
    except ValueError as err:
        raise InputError(f"--shapes: {err}") from None
    output = Path(args.output) if args.output else pipeline.default_output(args.model)
    targets = {"-o": output, "--report": args.report, "--engine": args.engine, "--timing-cache": args.timing_cache}
    targets = {flag: Path(path) for flag, path in targets.items() if path}
    for path in targets.values():
        io.check_writable(path, probe=True)
    targets["-o (its data file)"] = output.with_name(output.name + ".data")
    _check_targets(targets, [args.model])

    try:
        size = Path(args.model).stat().st_size
    except OSError:
        size = 0  # load_model says what is wrong
    progress.begin(f"loading {args.model} ({size / 2**20:.0f} MB)" if size > _LARGE else None)
    model, external = io.load_model(args.model)
    _check_targets(targets, io.data_files(model))
    pipeline.check_opset(model, args.model)
    check_dim_names(model, dims)
    progress.end(f"loaded {args.model} ({len(model.graph.node)} nodes)")
    target = args.target or (_local_arch() if args.engine else None)
    progress.begin()
    fused, report = pipeline.fuse(model, only, consume=not args.verify,  # verify needs the original intact
                                  precision=args.precision, calibration=calibration, calib_method=calib_method,
                                  dims=dims, quiet=args.quiet, target=target, fp8_chains=args.fp8_chains,
                                  fp8_rotate_qk=args.fp8_rotate_qk)
    if args.engine and target is None:
        report.notes.append("no GPU visible to choose convs for: every conv fused (give --target ARCH)")
    report.model = args.model
    progress.end(f"rewrote: {report.summary()}")

    failure = None
    if args.verify:
        from trt_fusedattn.verification import verify

        progress.begin("verifying under onnxruntime (original vs fused, custom nodes by the numpy reference)")
        try:  # whatever stops it, the report says so
            report.verification = verify(model, fused, seed=args.seed, dims=dims, rtol=args.rtol, atol=args.atol)
            progress.end("verified" if report.verification.passed else "verification FAILED")
            report.verification.raise_if_failed()
        except FuseError as err:
            failure = err
            report.notes.append(f"fused model not saved: {err}")

    staged = None
    try:
        if failure is None:  # written beside the output now, put in place after the report
            progress.begin()
            staged = io.stage_model(fused, output, external_data=True if external else None)
            report.output = str(output)
            report.notes.extend(f"external data: {final}" for _, final in staged.moves if final != output)

        ok, reason = trt_layer.available() if args.engine else (False, "")
        if args.engine and not ok:
            failure = failure or TensorRTUnavailable(f"--engine needs TensorRT's builder: {reason}")
        elif args.engine and failure is None:
            progress.begin(f"building TensorRT engine {args.engine}")
            try:
                trt_layer.build_engine(staged.path, args.engine, precision=args.precision, dims=dims, shapes=shapes,
                                       timing_cache=args.timing_cache, quiet=args.quiet, notes=report.notes)
            except FuseError as err:  # the report is still written
                failure = err
                report.notes.append(f"engine not built: {err}")
            else:
                report.notes.append(f"engine: {args.engine}")
                progress.end(f"built {args.engine}")

        if args.report:  # the report first, then the model: both are written, or neither
            io.stage_text(args.report, report.to_json()).publish()
        if staged is not None:
            try:
                staged.publish()
            except BaseException:
                if args.report:
                    Path(args.report).unlink(missing_ok=True)
                raise
            progress.end(f"saved {output}")
    finally:
        if staged is not None:
            staged.discard()
    if not args.quiet:
        print(report.table())
    if failure is not None:
        raise failure
    return 0


class Stopped(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived: unwinds like Ctrl-C, so every temporary file is removed."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop(signum, frame):
    for sig in _STOP_SIGNALS:  # the cleanup that follows runs undisturbed by a second signal
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


def _telemetry_off() -> None:
    """Dependencies' telemetry off unless allowed: onnxruntime (>= 1.29 on Linux) otherwise writes a
    device id under ~/.cache and uploads events; it reads ORT_DISABLE_TELEMETRY once, at first import."""
    if os.environ.get(ALLOW_TELEMETRY) != "1":
        os.environ["ORT_DISABLE_TELEMETRY"] = "1"


def main(argv=None) -> int:
    _telemetry_off()
    args = parser().parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()  # signals are set there only
    previous = {sig: signal.signal(sig, _stop) for sig in _STOP_SIGNALS} if in_main_thread else {}
    try:
        return run(args)
    except FuseError as err:
        print(f"fuse-onnx: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt as err:
        signum = getattr(err, "signum", signal.SIGINT)
        print(f"fuse-onnx: error: stopped by {signal.Signals(signum).name}; no partial output was left",
              file=sys.stderr)
        return 128 + signum
    except MemoryError:
        print("fuse-onnx: error: out of memory; verify with smaller --dim sizes or on a machine with more memory",
              file=sys.stderr)
        return 2
    except Exception as err:
        if args.debug:
            raise
        if isinstance(err, OSError) and err.filename is not None:  # a named file the checks did not foresee
            print(f"fuse-onnx: error: {err.filename}: {err.strerror or err}; check the path and its permissions",
                  file=sys.stderr)
            return 2
        first = str(err).splitlines()[0] if str(err) else ""
        print(f"fuse-onnx: error: internal error ({type(err).__name__}: {first}); "
              f"rerun with --debug and report the traceback", file=sys.stderr)  # a bug
        return 70
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
