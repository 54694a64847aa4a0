"""``Engine``: run a built engine on the caller's GPU arrays (torch, CuPy: zero copy, on the caller's stream) or
on numpy arrays (copied to and from the GPU). Uses the full TensorRT runtime, else the lean runtime
(``tensorrt_lean``, which runs engines built with ``version_compatible=True``).

    engine = Engine("model.engine")
    outputs = engine({"input_ids": ids, "attention_mask": mask})      # {output name: array of the inputs' kind}
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from trt_fusedattn.errors import TensorRTUnavailable
from trt_fusedattn.launcher.arrays import DTYPE_SIZES, caller_stream, device_array, empty_like_kind, require
from trt_fusedattn.launcher.launch import check, current_context, driver
from trt_fusedattn.tensorrt import INSTALL_HINT

_TRT_DTYPES = {"HALF": "float16", "BF16": "bfloat16", "FLOAT": "float32", "INT32": "int32", "INT64": "int64",
               "INT8": "int8", "UINT8": "uint8", "BOOL": "bool", "FP8": "float8_e4m3fn"}


def runtime_module():
    """``tensorrt`` if importable, else ``tensorrt_lean``; TensorRTUnavailable when neither is."""
    for name in ("tensorrt", "tensorrt_lean"):
        try:
            return __import__(name)
        except Exception:  # ImportError or a missing library behind the bindings
            continue
    raise TensorRTUnavailable(f"no TensorRT runtime is installed (tensorrt or tensorrt_lean); {INSTALL_HINT}")


def _numpy_dtype(name: str):
    if name in ("bfloat16", "float8_e4m3fn"):
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


class _HostStaging:
    """Device copies of numpy inputs and device buffers for outputs, freed on close (the numpy path)."""

    def __init__(self, device: int):
        self.device, self.buffers = device, []

    def alloc(self, nbytes: int) -> int:
        drv = driver()
        with current_context(self.device):
            ptr = int(check(drv.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes})"))
        self.buffers.append(ptr)
        return ptr

    def upload(self, array: np.ndarray, stream: int) -> int:
        array = np.ascontiguousarray(array)
        ptr = self.alloc(array.nbytes)
        with current_context(self.device):
            check(driver().cuMemcpyHtoDAsync(ptr, array.ctypes.data, array.nbytes, driver().CUstream(stream)),
                  "cuMemcpyHtoDAsync")
        return ptr

    def download(self, ptr: int, shape, dtype, stream: int) -> np.ndarray:
        out = np.empty(shape, dtype)
        drv = driver()
        with current_context(self.device):
            check(drv.cuMemcpyDtoHAsync(out.ctypes.data, ptr, out.nbytes, drv.CUstream(stream)), "cuMemcpyDtoHAsync")
            check(drv.cuStreamSynchronize(drv.CUstream(stream)), "cuStreamSynchronize")
        return out

    def close(self):
        drv = driver()
        with current_context(self.device):
            for ptr in self.buffers:
                check(drv.cuMemFree(ptr), "cuMemFree")
        self.buffers = []


class Engine:
    """A deserialized engine and one execution context; call it with {input name: array} (or a list in I/O order)."""

    def __init__(self, engine, *, device: int = 0, verbose: bool = False):
        trt = runtime_module()
        self.trt, self.device = trt, device
        self.logger = trt.Logger(trt.Logger.VERBOSE if verbose else trt.Logger.WARNING)
        data = Path(engine).read_bytes() if isinstance(engine, (str, Path)) else bytes(engine)
        with current_context(device):  # TensorRT uses the primary context, as torch and CuPy do
            self.runtime = trt.Runtime(self.logger)
            self.engine = self.runtime.deserialize_cuda_engine(data)
            if self.engine is None:
                raise RuntimeError(f"TensorRT ({trt.__name__} {trt.__version__}) could not load the engine: built "
                                   "by another TensorRT version or for another GPU? (the lean runtime needs "
                                   "build_engine(..., version_compatible=True))")
            self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = lambda n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT  # noqa: E731
        self.input_names = [n for n in names if is_input(n)]
        self.output_names = [n for n in names if not is_input(n)]

    def dtype(self, name: str) -> str:
        dtype = self.engine.get_tensor_dtype(name)
        return _TRT_DTYPES.get(dtype.name, dtype.name)

    def __call__(self, inputs, *, stream=None, outputs: dict | None = None) -> dict:
        """Run once. Device arrays (torch/CuPy/...) run in place on ``stream`` (default: the first input's
        library's current stream) and outputs are allocated like the first input unless given in ``outputs``;
        numpy inputs are converted to the engine's dtypes, copied in, and numpy outputs returned (synchronously)."""
        if not isinstance(inputs, dict):
            inputs = dict(zip(self.input_names, inputs))
        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise ValueError(f"engine inputs {missing} not given (it takes {self.input_names})")
        host = all(isinstance(a, np.ndarray) for a in inputs.values())
        return self._run_host(inputs) if host else self._run_device(inputs, stream, outputs or {})

    def _bind_inputs(self, pointers_and_shapes: dict) -> None:
        for name, (ptr, shape) in pointers_and_shapes.items():
            if not self.context.set_input_shape(name, tuple(shape)):
                raise ValueError(f"input '{name}' shape {tuple(shape)} is outside the engine's optimization profile")
            self.context.set_tensor_address(name, ptr)

    def _execute(self, stream: int) -> None:
        with current_context(self.device):
            if not self.context.execute_async_v3(stream):
                raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log above)")

    def _run_device(self, inputs: dict, stream, given_outputs: dict) -> dict:
        arrays = {n: require(device_array(a, n), n, contiguous=True) for n, a in inputs.items()}
        for name, array in arrays.items():
            if array.dtype != self.dtype(name):
                raise ValueError(f"input '{name}' has dtype {array.dtype}; the engine takes {self.dtype(name)}")
        first = arrays[self.input_names[0]]
        handle = caller_stream(first, stream)
        self._bind_inputs({n: (a.ptr, a.shape) for n, a in arrays.items()})
        results = {}
        for name in self.output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            out = (require(device_array(given_outputs[name], name), name, contiguous=True) if name in given_outputs
                   else empty_like_kind(first, shape, self.dtype(name), name))
            self.context.set_tensor_address(name, out.ptr)
            results[name] = out.obj
        self._execute(handle)
        return results

    def _run_host(self, inputs: dict) -> dict:
        staging = _HostStaging(self.device)
        try:
            with current_context(self.device):
                stream = int(check(driver().cuStreamCreate(0), "cuStreamCreate"))
            try:
                self._bind_inputs({n: (staging.upload(np.asarray(a, _numpy_dtype(self.dtype(n))), stream),
                                       np.shape(a)) for n, a in inputs.items()})
                pending = {}
                for name in self.output_names:
                    shape = tuple(self.context.get_tensor_shape(name))
                    nbytes = int(np.prod(shape)) * DTYPE_SIZES[self.dtype(name)]
                    pending[name] = (staging.alloc(nbytes), shape)
                    self.context.set_tensor_address(name, pending[name][0])
                self._execute(stream)
                return {n: staging.download(p, s, _numpy_dtype(self.dtype(n)), stream) for n, (p, s) in pending.items()}
            finally:
                with current_context(self.device):
                    check(driver().cuStreamSynchronize(driver().CUstream(stream)), "cuStreamSynchronize")
                    check(driver().cuStreamDestroy(driver().CUstream(stream)), "cuStreamDestroy")
        finally:
            staging.close()

