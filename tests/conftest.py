"""Skip ``gpu``-marked tests without a usable CUDA device and ``tensorrt``-marked tests without TensorRT's builder."""
from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason() -> str | None:
    """None when a CUDA device can be launched on through cuda-python, else why not."""
    try:
        from trt_fusedattn.launcher.launch import device_count
        count = device_count()
    except Exception as exc:  # LaunchError, or anything the driver raises
        return f"no usable CUDA device: {exc}"
    return None if count else "no usable CUDA device: the driver reports 0 devices"


@functools.lru_cache(maxsize=None)
def tensorrt_unavailable_reason() -> str | None:
    from trt_fusedattn.tensorrt import available
    ok, reason = available()
    return None if ok else reason


def pytest_collection_modifyitems(config, items):
    for item in items:
        for marker, reason_of in (("gpu", gpu_unavailable_reason), ("tensorrt", tensorrt_unavailable_reason)):
            if item.get_closest_marker(marker) is not None:
                reason = reason_of()
                if reason:
                    item.add_marker(pytest.mark.skip(reason=reason))
