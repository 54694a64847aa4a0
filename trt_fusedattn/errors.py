"""The errors a user of ``fuse-onnx`` or the API can act on: one line saying what was wrong and what to do.

The CLI prints ``fuse-onnx: error: <message>`` for any of them and exits with ``exit_code``, no traceback.
"""
from __future__ import annotations


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type name when empty): what a one-line error quotes."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__


class FuseError(Exception):
    """Base of the user-facing errors; ``str(err)`` is the one-line message."""

    exit_code = 2


class InputError(FuseError):
    """The model given cannot be read or is not one we can rewrite (missing, not ONNX, corrupt, opset)."""

    exit_code = 2


class VerificationError(FuseError):
    """The fused model does not compute what the original did, within tolerance."""

    exit_code = 1


class TensorRTUnavailable(FuseError):
    """A step the user asked for needs TensorRT's builder, which is not installed here."""

    exit_code = 3
