"""``build_engine``: a TensorRT engine from a fused ONNX model, our ops running as AOT plugins (their PTX embedded).

    build_engine("model.fused.onnx", "model.engine", precision="fp16",
                 shapes={"input_ids": ((1, 8), (4, 128), (8, 512))})        # or dims={"batch": 4, "seq": 128}
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import onnx
import onnx.external_data_helper

from trt_fusedattn.errors import FuseError
from trt_fusedattn.tensorrt import require_tensorrt
from trt_fusedattn.tensorrt.plugins import prepare_model, register_plugins

PRECISIONS = ("fp32", "fp16", "bf16", "fp8")


class EngineBuildError(FuseError):
    """TensorRT could not parse the model or build the engine; the message carries its first error."""

    exit_code = 1


def _progress(message: str) -> None:
    print(f"fuse-onnx: tensorrt: {message}", file=sys.stderr, flush=True)


def _logger(trt, verbose: bool):
    """A TensorRT logger that prints warnings (everything when verbose) to stderr and keeps the errors."""

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.errors = []

        def log(self, severity, msg):
            if int(severity) <= int(trt.ILogger.Severity.ERROR):
                self.errors.append(msg)
            if verbose or int(severity) <= int(trt.ILogger.Severity.WARNING):
                print(f"fuse-onnx: tensorrt [{severity.name}]: {msg}", file=sys.stderr, flush=True)

    return Logger()


def _network_flags(trt) -> int:
    flags = 0
    for name in ("PREFER_AOT_PYTHON_PLUGINS",):  # our plugins have only AOT implementations
        if hasattr(trt.NetworkDefinitionCreationFlag, name):
            flags |= 1 << int(getattr(trt.NetworkDefinitionCreationFlag, name))
    return flags


def _set_precision(trt, config, precision: str) -> None:
    if precision not in PRECISIONS:
        raise EngineBuildError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return
    wanted = {"fp16": ("FP16",), "bf16": ("BF16",), "fp8": ("FP8", "FP16")}[precision]
    missing = [f for f in wanted if not hasattr(trt.BuilderFlag, f)]
    if missing:
        raise EngineBuildError(f"TensorRT {trt.__version__} has no BuilderFlag.{missing[0]} (networks are strongly "
                               f"typed): export or convert the model to {precision} instead of asking for it here")
    for flag in wanted:
        config.set_flag(getattr(trt.BuilderFlag, flag))


def _input_dim_names(model: onnx.ModelProto) -> dict[str, list]:
    """Graph input name -> per-dimension name (dim_param) or size."""
    initializers = {i.name for i in model.graph.initializer}
    return {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input if i.name not in initializers}


def _profile(builder, network, dim_names: dict, shapes: dict | None, dims: dict | None):
    """An optimization profile covering every dynamic input (from ``shapes`` or the named ``dims``), or None."""
    shapes, dims = dict(shapes or {}), dict(dims or {})
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
                raise EngineBuildError(f"input '{tensor.name}' has dynamic dims {unknown}: give shapes="
                                       f"{{'{tensor.name}': (min, opt, max)}} or dims (fuse-onnx --dim NAME=SIZE)")
            low = opt = high = tuple(dims[names[j]] if d == -1 else d for j, d in enumerate(shape))
        else:
            continue
        profile.set_shape(tensor.name, tuple(low), tuple(opt), tuple(high))
        needed = True
    return profile if needed else None


def _parse(parser, model_path: Path) -> None:
    """Parse a prepared copy of the model (from memory; with external data, from a copy written beside the model
    so that its relative external-data paths resolve)."""
    prepared = prepare_model(onnx.load(str(model_path), load_external_data=False))
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


def build_engine(onnx_path, engine_path, *, precision: str = "fp32", shapes: dict | None = None,
                 dims: dict | None = None, workspace: int | None = None, version_compatible: bool = False,
                 verbose: bool = False) -> Path:
    """Build ``engine_path`` from the (fused) ONNX model at ``onnx_path`` and return its path.

    precision: fp32 | fp16 | bf16 | fp8 (TensorRT 10 builder flags; TensorRT 11 builds the model's own dtypes).
    shapes: {input: shape or (min, opt, max)} for the optimization profile; dims: {dim_param: size} for dynamic
    dims not in ``shapes``. workspace: bytes of builder workspace. version_compatible: an engine the lean runtime
    can run. The engine file is written atomically; progress goes to stderr."""
    require_tensorrt()
    import tensorrt as trt

    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    if not onnx_path.is_file():
        raise EngineBuildError(f"{onnx_path} does not exist")
    register_plugins()
    logger = _logger(trt, verbose)
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    start = time.perf_counter()
    _parse(parser, onnx_path)
    _progress(f"parsed {onnx_path.name}: {network.num_layers} layers ({time.perf_counter() - start:.1f} s)")

    config = builder.create_builder_config()
    _set_precision(trt, config, precision)
    if workspace:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace))
    if version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    profile = _profile(builder, network, _input_dim_names(onnx.load(str(onnx_path), load_external_data=False)),
                       shapes, dims)
    if profile is not None:
        config.add_optimization_profile(profile)

    start = time.perf_counter()
    _progress(f"building ({precision}); our kernels compile to PTX for this GPU on first use")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        first = logger.errors[0] if logger.errors else "no error reported"
        raise EngineBuildError(f"TensorRT could not build the engine: {first}")
    engine_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{engine_path.name}.", dir=engine_path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(memoryview(serialized))
    os.replace(tmp, engine_path)
    _progress(f"wrote {engine_path} ({engine_path.stat().st_size / 2**20:.1f} MiB, "
              f"{time.perf_counter() - start:.1f} s)")
    return engine_path
