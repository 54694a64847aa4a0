"""``build_engine``: a TensorRT engine from a fused ONNX model, our ops running as AOT plugins (their PTX embedded).

    build_engine("model.fused.onnx", "model.engine", precision="fp16",
                 shapes={"input_ids": ((1, 8), (4, 128), (8, 512))},     # or parse_shapes("input_ids:1x8/4x128/8x512")
                 timing_cache="model.timing")                              # reused and updated

Networks are strongly typed on every TensorRT line (11.x has no other kind and no FP16/BF16/FP8 builder flags;
10.x builds them so too): the engine computes in the model's own dtypes. ``precision`` names the dtype the
custom nodes must compute in; float32 custom nodes get Casts to it (``prepare.py``), and a mismatch is refused
before TensorRT starts.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import onnx
import onnx.external_data_helper

from trt_fusedattn.errors import FuseError
from trt_fusedattn.tensorrt import require_tensorrt
from trt_fusedattn.tensorrt.plugins import register_plugins
from trt_fusedattn.tensorrt.prepare import PRECISIONS, prepare_model


class EngineBuildError(FuseError):
    """TensorRT could not parse the model or build the engine; the message carries its first error."""

    exit_code = 1


def _say(quiet: bool, message: str) -> None:
    if not quiet:
        print(f"trt_fusedattn: tensorrt: {message}", file=sys.stderr, flush=True)


def _logger(trt, verbose: bool, quiet: bool):
    """A TensorRT logger that prints warnings (everything when verbose; nothing when quiet) to stderr and keeps
    the errors."""

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors = []

        def log(self, severity, msg):
            if int(severity) <= int(trt.ILogger.Severity.ERROR):
                self.errors.append(msg)
            if not quiet and (verbose or int(severity) <= int(trt.ILogger.Severity.WARNING)):
                print(f"trt_fusedattn: tensorrt [{severity.name}]: {msg}", file=sys.stderr, flush=True)

    return Logger()


def _progress_monitor(trt, quiet: bool):
    """Builder phases as they start and finish (TensorRT's IProgressMonitor), or None when quiet or absent."""
    if quiet or not hasattr(trt, "IProgressMonitor"):
        return None

    class Monitor(trt.IProgressMonitor):
        def __init__(self):
            trt.IProgressMonitor.__init__(self)
            self.started = {}

        def phase_start(self, phase_name, parent_phase, num_steps):
            self.started[phase_name] = time.perf_counter()
            if parent_phase is None:
                _say(False, f"{phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name, step):
            return True  # never cancel

        def phase_finish(self, phase_name):
            began = self.started.pop(phase_name, None)
            if began is not None and not self.started:
                _say(False, f"{phase_name} done ({time.perf_counter() - began:.1f} s)")

    return Monitor()


def _network_flags(trt) -> int:
    """Strongly typed (where the flag exists: 11.x networks always are) and AOT plugins preferred (ours have
    only AOT implementations; the ONNX parser asks the creator for AOT under this flag)."""
    flags = 0
    for name in ("STRONGLY_TYPED", "PREFER_AOT_PYTHON_PLUGINS"):
        if hasattr(trt.NetworkDefinitionCreationFlag, name):
            flags |= 1 << int(getattr(trt.NetworkDefinitionCreationFlag, name))
    return flags


def parse_shapes(specs) -> dict:
    """``["ids:1x8/4x128/8x512", "mask:4x128"]`` (or one comma-separated string) -> {input: (min, opt, max)};
    one shape means min = opt = max. ValueError (one line) on a malformed spec."""
    if isinstance(specs, str):
        specs = specs.split(",")
    shapes = {}
    for spec in specs:
        name, sep, dims = spec.strip().rpartition(":")
        parts = dims.split("/")
        try:
            triple = [tuple(int(d) for d in part.split("x")) for part in parts]
        except ValueError:
            triple = []
        if not sep or not name or len(triple) not in (1, 3) or len({len(t) for t in triple}) != 1:
            raise ValueError(f"shape spec {spec!r} is not NAME:MIN/OPT/MAX or NAME:SHAPE with dims joined by 'x' "
                             "(e.g. input_ids:1x8/4x128/8x512)")
        shapes[name] = tuple(triple) * 3 if len(triple) == 1 else tuple(triple)
    return shapes


def _input_dim_names(model: onnx.ModelProto) -> dict[str, list]:
    """Graph input name -> per-dimension name (dim_param) or size."""
    initializers = {i.name for i in model.graph.initializer}
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input if i.name not in initializers}


def _profile(builder, network, dim_names: dict, shapes: dict | None, dims: dict | None):
    """An optimization profile covering every dynamic input (from ``shapes`` or the named ``dims``), or None."""
    shapes, dims = dict(shapes or {}), dict(dims or {})
    unknown_inputs = set(shapes) - {network.get_input(i).name for i in range(network.num_inputs)}
    if unknown_inputs:
        raise EngineBuildError(f"shapes given for {sorted(unknown_inputs)}, which are not inputs of the model")
    profile, needed = builder.create_optimization_profile(), False
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shape = tuple(tensor.shape)
        if tensor.name in shapes:
            given = shapes[tensor.name]
            low, opt, high = given if isinstance(given[0], (tuple, list)) else (given, given, given)
        elif -1 in shape:
            names = dim_names.get(tensor.name, [None] * len(shape))
            unknown = [str(names[j] or j) for j, d in enumerate(shape) if d == -1 and names[j] not in dims]
            if unknown:
                raise EngineBuildError(f"input '{tensor.name}' has dynamic dims {unknown}: give its shapes "
                                       f"(--shapes {tensor.name}:MIN/OPT/MAX) or the dims (--dim NAME=SIZE)")
            low = opt = high = tuple(dims[names[j]] if d == -1 else d for j, d in enumerate(shape))
        else:
            continue
        profile.set_shape(tensor.name, tuple(low), tuple(opt), tuple(high))
        needed = True
    return profile if needed else None


def _parse(parser, model_path: Path, precision: str | None, notes: list) -> None:
    """Parse a prepared copy of the model (from memory; with external data, from a copy written beside the model
    so that its relative external-data paths resolve)."""
    prepared = prepare_model(onnx.load(str(model_path), load_external_data=False), precision, notes)
    if not any(onnx.external_data_helper.uses_external_data(t) for t in prepared.graph.initializer):
        ok = parser.parse(prepared.SerializeToString(), str(model_path))
    else:
        fd, tmp = tempfile.mkstemp(prefix=f".{model_path.stem}.trt-", suffix=".onnx", dir=model_path.parent)
        os.close(fd)
        try:
            onnx.save(prepared, tmp)
            ok = parser.parse_from_file(tmp)
        finally:
            os.unlink(tmp)
    if not ok:
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        first = errors[0] if errors else None
        where = f" (node {first.node_name()}, {first.node_operator()})" if first and first.node_name() else ""
        raise EngineBuildError(f"TensorRT could not parse {model_path.name}{where}: "
                               f"{first.desc() if first else 'no error reported'}")


def _write_atomically(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(memoryview(data))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _timing_cache(trt, config, path: Path | None):
    """The builder's timing cache, loaded from ``path`` when that file exists (else empty)."""
    if path is None:
        return None
    data = path.read_bytes() if path.is_file() else b""
    cache = config.create_timing_cache(data)
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        raise EngineBuildError(f"timing cache {path} was written by another TensorRT version or GPU; delete it "
                               "or give another path")
    return cache


def engine_summary(trt, serialized, logger) -> dict:
    """{"layers": n, "plugins": {op name: count}}: which layers of the built engine are our plugins (from the
    engine inspector's detailed layer information)."""
    from trt_fusedattn.plugins import OPS
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(serialized)
    info = json.loads(engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    layers = info.get("Layers", [])
    counts = {op.contract.name: sum(op.contract.name in json.dumps(layer) for layer in layers) for op in OPS}
    return {"layers": len(layers), "plugins": counts}


def build_engine(onnx_path, engine_path, *, precision: str | None = None, shapes: dict | None = None,
                 dims: dict | None = None, workspace: int | None = None, version_compatible: bool = False,
                 timing_cache=None, verbose: bool = False, quiet: bool = False,
                 notes: list | None = None) -> Path:
    """Build ``engine_path`` from the (fused) ONNX model at ``onnx_path`` and return its path.

    precision: None (the model's own dtypes), fp16, bf16, fp8 or fp32: the dtype our custom nodes compute in
    (float32 custom nodes are cast to it; see ``prepare.py``). shapes: {input: shape or (min, opt, max)} for the
    optimization profile (``parse_shapes`` reads the CLI's form); dims: {dim_param: size} for dynamic dims not in
    ``shapes``. workspace: bytes of builder workspace. version_compatible: an engine the lean runtime can run.
    timing_cache: a file of TensorRT's timing cache, read when it exists and rewritten after the build.
    Progress goes to stderr (nothing when ``quiet``); what was changed in the model, and the engine summary,
    are appended to ``notes``. The engine file is written atomically."""
    require_tensorrt()
    import tensorrt as trt

    notes = [] if notes is None else notes
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    if not onnx_path.is_file():
        raise EngineBuildError(f"{onnx_path} does not exist")
    if precision is not None and precision not in PRECISIONS:
        raise EngineBuildError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    register_plugins()
    logger = _logger(trt, verbose, quiet)
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    start = time.perf_counter()
    _parse(parser, onnx_path, precision, notes)
    _say(quiet, f"parsed {onnx_path.name}: {network.num_layers} layers ({time.perf_counter() - start:.1f} s)")

    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # the inspector then names each layer's plugin
    monitor = _progress_monitor(trt, quiet)
    if monitor is not None:
        config.progress_monitor = monitor
    if workspace:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace))
    if version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    cache_path = Path(timing_cache) if timing_cache else None
    cache = _timing_cache(trt, config, cache_path)
    profile = _profile(builder, network, _input_dim_names(onnx.load(str(onnx_path), load_external_data=False)),
                       shapes, dims)
    if profile is not None:
        config.add_optimization_profile(profile)

    start = time.perf_counter()
    _say(quiet, "building (strongly typed); our kernels compile to PTX for this GPU on first use")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        first = logger.errors[0] if logger.errors else "no error reported"
        raise EngineBuildError(f"TensorRT could not build the engine: {first}")
    _write_atomically(engine_path, serialized)
    if cache is not None:
        _write_atomically(cache_path, config.get_timing_cache().serialize())
    summary = engine_summary(trt, serialized, logger)
    ours = ", ".join(f"{n} {name}" for name, n in summary["plugins"].items() if n) or "none of our plugins"
    notes.append(f"engine {engine_path.name}: {summary['layers']} layers, {ours}")
    _say(quiet, f"wrote {engine_path} ({engine_path.stat().st_size / 2**20:.1f} MiB, "
                f"{time.perf_counter() - start:.1f} s): {summary['layers']} layers, {ours}")
    return engine_path
