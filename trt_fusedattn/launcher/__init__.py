"""Compile our CUDA sources to PTX (cached), take the caller's device arrays, and launch a launch plan.

A direct op API (``trt_fusedattn.attention``, ``trt_fusedattn.conv2d``) is, in order::

    from trt_fusedattn.launcher import device_array, same_device, require, empty_like_kind, caller_stream, \\
        device_arch, launch
    q, k, v = (device_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))   # ArrayError for host arrays
    dev = same_device([q, k, v], ["q", "k", "v"])
    arch = device_arch(dev)
    plan = plan_attention([q.shape, k.shape, v.shape, None, None], [q.dtype, k.dtype, v.dtype, None, None],
                          FUSED_ATTENTION.resolve(attrs), arch)
    o = empty_like_kind(q, out_shape, q.dtype) if out is None else device_array(out, "out")
    launch(plan, arch, [q, k, v, None, None], [o], stream=caller_stream(q, stream), device=dev)
    return o.obj

Errors are one line: CompileError (nvcc), ArrayError (arguments), LaunchError (driver, cuda-python, GPU).
"""
from trt_fusedattn.launcher.arrays import (ArrayError, DeviceArray, caller_stream, device_array, empty_like_kind,
                                           require, same_device, stream_handle, torch_current_stream,
                                           torch_stream_query)
from trt_fusedattn.launcher.compile import CompileError, compile_cubin, compile_ptx
from trt_fusedattn.launcher.launch import LaunchError, device_arch, launch, precompile
from trt_fusedattn.launcher.plan import LaunchPlan

__all__ = ["ArrayError", "CompileError", "DeviceArray", "LaunchError", "LaunchPlan", "caller_stream",
           "compile_cubin", "compile_ptx", "device_arch", "device_array", "empty_like_kind", "launch", "precompile",
           "require", "same_device", "stream_handle", "torch_current_stream", "torch_stream_query"]
