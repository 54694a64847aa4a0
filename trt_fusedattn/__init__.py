"""Fuse attention and convolution subgraphs of ONNX models into custom TensorRT plugins backed by fused CUDA kernels."""
__version__ = "0.1.0"

# The ONNX-side API, imported on first use so ``import trt_fusedattn`` stays light:
#   fuse(model_or_path, only=None, *, precision=None, calibration='random:16', calib_method='max', dims=None,
#        quiet=True) -> (fused ModelProto, Report)   (precision='fp8': FP8 FusedConvs calibrated on the original)
#   verify(original, fused, inputs=None, seed=0, dims=None, rtol=None, atol=0, implementations=None) -> Verification
#   run_model(model, feeds, implementations=None) -> {output name: array} (onnxruntime, custom nodes in Python)
#   random_inputs(model, seed=0, dims=None), load_model(path) -> (model, had external data), save_model(model, path),
#   load_weights(model) (external tensors of a loaded model read into memory)
# and each op's direct GPU call, named by its record in ``plugins.OPS``: attention(q, k, v, ...) (FusedAttention on
# the caller's GPU arrays), conv2d(x, w, bias, ...) (FusedConv on channels-last GPU arrays).
_LAZY = {
    "fuse": "trt_fusedattn.pipeline",
    "Report": "trt_fusedattn.report",
    "verify": "trt_fusedattn.verification",
    "Verification": "trt_fusedattn.verification",
    "run_model": "trt_fusedattn.ort_session",
    "random_inputs": "trt_fusedattn.random_inputs",
    "load_model": "trt_fusedattn.io",
    "save_model": "trt_fusedattn.io",
    "load_weights": "trt_fusedattn.io",
    "FuseError": "trt_fusedattn.errors",
    "InputError": "trt_fusedattn.errors",
    "VerificationError": "trt_fusedattn.errors",
}


def _op_apis() -> dict:
    """Public name -> op record of each op's direct GPU call (``attention``, ``conv2d``), from ``plugins.OPS``."""
    from trt_fusedattn.plugins import OPS
    return {op.api[0]: op for op in OPS if op.api}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    op = _op_apis().get(name)
    if op is not None:  # imported on first use, so ``import trt_fusedattn`` needs no GPU libraries
        function = globals()[name] = op.api_function()  # later accesses skip __getattr__ (per-call overhead)
        return function
    raise AttributeError(f"module 'trt_fusedattn' has no attribute {name!r}")
