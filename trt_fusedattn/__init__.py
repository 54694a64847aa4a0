"""Fuse attention and convolution subgraphs of ONNX models into custom TensorRT plugins backed by fused CUDA kernels."""
__version__ = "0.1.0"

# The ONNX-side API, imported on first use so ``import trt_fusedattn`` stays light:
#   fuse(model_or_path, only=None) -> (fused ModelProto, Report)
#   verify(original, fused, inputs=None, seed=0, dims=None, rtol=None, atol=0, implementations=None) -> Verification
#   run_model(model, feeds, implementations=None) -> {output name: array} (onnxruntime, custom nodes in Python)
#   random_inputs(model, seed=0, dims=None), load_model(path) -> (model, had external data), save_model(model, path),
#   load_weights(model) (external tensors of a loaded model read into memory)
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


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trt_fusedattn' has no attribute {name!r}")


def attention(q, k, v, **kwargs):
    """FusedAttention on the caller's GPU arrays (see ``trt_fusedattn.plugins.attention.api.attention``);
    imported on first call so ``import trt_fusedattn`` needs no GPU libraries."""
    from trt_fusedattn.plugins.attention.api import attention as run
    return run(q, k, v, **kwargs)


def conv2d(x, w, bias=None, **kwargs):
    """FusedConv on channels-last GPU arrays (see ``trt_fusedattn.plugins.conv.api.conv2d``); imports on call."""
    from trt_fusedattn.plugins.conv.api import conv2d as _conv2d
    return _conv2d(x, w, bias, **kwargs)
