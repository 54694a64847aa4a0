"""The rewrite's side of "never slower than TensorRT alone": a matched chain becomes a ConvShape from what the
graph knows statically, and plugins/conv/tensorrt_choice decides for the target arch whether it is fused or left
to TensorRT (then reported with the evidence, and TensorRT's own conv fusion runs the unchanged Conv)."""
from __future__ import annotations

from trt_fusedattn.plugins.conv.tensorrt_choice import ConvShape, choose
from trt_fusedattn.rewrites import Site
from trt_fusedattn.rewrites._shapes import TensorShapes
from trt_fusedattn.rewrites.conv.epilogue import Chain

FAMILY = "conv"


def conv_shape(chain: Chain, precision: str | None, x_shape: list | None) -> ConvShape:
    """The chain's conv as the choice table keys it; spatial size and batch only where X's dims are static ints."""
    static = lambda dims: tuple(dims) if all(isinstance(d, int) and d > 0 for d in dims) else None  # noqa: E731
    groups = chain.conv_attrs["group"]
    return ConvShape(kernel=tuple(chain.weight.shape[2:]), stride=tuple(chain.conv_attrs["strides"]),
                     channels=chain.weight.shape[1] * groups, filters=chain.weight.shape[0], groups=groups,
                     spatial=static(x_shape[2:]) if x_shape else None,
                     batch=x_shape[0] if x_shape and isinstance(x_shape[0], int) and x_shape[0] > 0 else None,
                     precision="fp8" if precision == "fp8" else "fp16", residual=chain.residual is not None)


def leave_to_tensorrt(chain: Chain, target: str, precision: str | None, shapes: TensorShapes) -> Chain | Site:
    """The chain itself (to be fused, with the evidence kept for its Site) or, where TensorRT is faster on
    ``target``, a Site left alone whose reason names the evidence."""
    choice = choose(conv_shape(chain, precision, shapes.of(chain.x)), target)
    if choice is None or not choice.to_tensorrt:
        chain.choice = choice
        return chain
    return Site(FAMILY, chain.conv.name, False, reason=choice.reason, shapes={"X": shapes.report(chain.x)},
                details={"left_to": "TensorRT", "target": choice.arch})
