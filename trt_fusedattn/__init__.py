"""Fuse attention and convolution subgraphs of ONNX models into custom TensorRT plugins backed by fused CUDA kernels."""
__version__ = "0.1.0"
