"""``fuse-onnx``: rewrite a model's attention and convolution subgraphs into our custom ops, verify, save,
and (with TensorRT's builder) build an engine.

Exit status: 0 done; 1 the fused model failed verification; 2 bad usage or input; 3 an engine was asked for
and TensorRT's builder is missing; 70 an internal error (a bug: rerun with --debug for the traceback).
Progress goes to stderr, the report table to stdout.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from trt_fusedattn.errors import FuseError, InputError, TensorRTUnavailable

PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
_LARGE = 256 * 2**20  # bytes of model file from which loading is announced before it starts


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fuse-onnx",
        description="Fuse attention and convolution subgraphs of an ONNX model into trt_fusedattn custom ops "
                    "(FusedAttention, FusedConv), verify against the original, and optionally build a TensorRT engine.",
        epilog="exit status: 0 done (also with nothing to fuse), 1 verification failed, 2 bad usage or input, "
               "3 --engine without TensorRT's builder, 70 internal error")
    p.add_argument("model", help="the .onnx model (external data files beside it)")
    p.add_argument("-o", "--output", help="fused model path (default: MODEL.fused.onnx beside the input)")
    p.add_argument("--only", metavar="FAMILIES", help="comma-separated rewrite families to run: attention,conv")
    p.add_argument("--verify", action="store_true",
                   help="run original and fused model under onnxruntime on random inputs and compare outputs")
    p.add_argument("--rtol", type=float, help="relative tolerance, max|fused-original| / max|original| "
                                              "(default by dtype: 1e-4 fp32, 1e-2 fp16, 2e-2 bf16)")
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance; an output passes within either")
    p.add_argument("--seed", type=int, default=0, help="seed of the random verification inputs")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a named dynamic input dimension for verification (repeatable)")
    p.add_argument("--report", metavar="JSON", help="write the report (sites, verification) as JSON")
    p.add_argument("--engine", metavar="PATH", help="build a TensorRT engine of the fused model (needs TensorRT)")
    precision = p.add_mutually_exclusive_group()
    for name in PRECISIONS[1:]:
        precision.add_argument(f"--{name}", dest="precision", action="store_const", const=name,
                               help=f"allow {name.upper()} kernels in the engine")
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
        if not name or not size.isdigit() or int(size) < 1:
            raise InputError(f"--dim {item!r}: expected NAME=SIZE with a positive size, e.g. --dim sequence_length=64")
        dims[name] = int(size)
    return dims


def run(args: argparse.Namespace) -> int:
    from trt_fusedattn import io, pipeline
    from trt_fusedattn import tensorrt as trt_layer

    progress = _Progress(args.quiet)
    only = [f.strip() for f in args.only.split(",") if f.strip()] if args.only else None
    pipeline.check_families(only)
    dims = _dims(args.dim)
    output = Path(args.output) if args.output else pipeline.default_output(args.model)
    for path in (output, args.report, args.engine):
        if path:
            io.check_writable(path)

    size = Path(args.model).stat().st_size if Path(args.model).is_file() else 0
    progress.begin(f"loading {args.model} ({size / 2**20:.0f} MB)" if size > _LARGE else None)
    model, external = io.load_model(args.model)
    pipeline.check_opset(model, args.model)
    progress.end(f"loaded {args.model} ({len(model.graph.node)} nodes)")
    progress.begin()
    fused, report = pipeline.fuse(model, only, consume=not args.verify)  # verify needs the original intact
    report.model = args.model
    progress.end(f"rewrote: {report.summary()}")

    failure = None
    if args.verify:
        from trt_fusedattn.verification import verify

        progress.begin("verifying under onnxruntime (original vs fused, custom nodes by the numpy reference)")
        report.verification = verify(model, fused, seed=args.seed, dims=dims, rtol=args.rtol, atol=args.atol)
        progress.end("verified" if report.verification.passed else "verification FAILED")
        try:
            report.verification.raise_if_failed()
        except FuseError as err:
            failure = err
            report.notes.append(f"fused model not saved: {err}")

    if failure is None:
        progress.begin()
        written = io.save_model(fused, output, external_data=True if external else None)
        report.output = str(output)
        report.notes.extend(f"external data: {p}" for p in written[1:])
        progress.end(f"saved {output}")

    ok, reason = trt_layer.available()
    if args.engine and not ok:
        failure = failure or TensorRTUnavailable(f"--engine needs TensorRT's builder: {reason}")
    elif args.engine and failure is None:
        from trt_fusedattn.tensorrt import build_engine

        progress.begin(f"building TensorRT engine {args.engine}")
        try:
            build_engine(output, args.engine, precision=args.precision or "fp32", dims=dims)
        except FuseError as err:  # the report is still written
            failure = err
            report.notes.append(f"engine not built: {err}")
        else:
            report.notes.append(f"engine: {args.engine}")
            progress.end(f"built {args.engine}")
    elif not ok:
        report.notes.append(f"building an engine (--engine) needs TensorRT's builder: {reason}")

    if args.report:
        io.write_text(args.report, report.to_json())
    if not args.quiet:
        print(report.table())
    if failure is not None:
        raise failure
    return 0


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except FuseError as err:
        print(f"fuse-onnx: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("fuse-onnx: error: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug: one line unless --debug
        if args.debug:
            raise
        print(f"fuse-onnx: error: internal error ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
              f"rerun with --debug and report the traceback", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
