"""A matched conv chain (``Chain``) and the constant epilogue folded into it: BatchNormalization and Add, Sub, Mul,
Div by a per-channel constant, in float64 (scales into W, offsets into shift)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trt_fusedattn.plugins.tensorrt_choice import Choice
from trt_fusedattn.rewrites._graph import consumers, folded_value, is_op, is_standard, other_operand, sole_consumer
from trt_fusedattn.rewrites.conv.activation import NO_ACTIVATION, Activation

WEIGHT_DTYPES = ("float32", "float16")  # ONNX Conv types FusedConv takes (Conv has no bfloat16)


@dataclass
class Chain:
    """One matched site: the Conv, its folded constants, and the tensors the fused node reads and writes."""

    conv: gs.Node
    x: gs.Variable
    weight: np.ndarray                      # float64, ONNX layout [K, C/G, *kernel]
    weight_dtype: np.dtype
    shift: np.ndarray | None                # float64 [K]
    conv_attrs: dict
    tail: gs.Variable                       # output before the residual add
    activation: Activation = NO_ACTIVATION
    bn_folded: int = 0
    pad: str | None = None                  # Pad before the Conv: None none, "" absorbed, else why it stays
    add: gs.Node | None = None
    residual: gs.Variable | None = None
    post_activation: Activation = NO_ACTIVATION
    out: gs.Variable | None = None
    chain_end: str = ""
    choice: Choice | None = None            # the target arch's evidence that FusedConv beats TensorRT here

    def drop_residual(self, why: str) -> None:
        self.add, self.residual, self.post_activation, self.out = None, None, NO_ACTIVATION, self.tail
        self.chain_end = why


def fold_constant_epilogue(chain: Chain, graph: gs.Graph) -> gs.Variable:
    """Fold what follows the Conv while it is affine per channel: BatchNormalization, and Add, Sub, Mul, Div by a
    per-channel constant (scales into W, offsets into shift). Returns the tensor reached."""
    tensor = chain.tail
    while True:
        node = sole_consumer(tensor, graph)
        if node is None:  # read by several nodes: maybe an x * f(x) activation, which the caller matches next
            return tensor
        if is_op(node, "BatchNormalization") and node.inputs[0] is tensor:
            why = _fold_batch_norm(chain, node, graph)
            if why:
                chain.chain_end = why
                return tensor
        elif not _fold_per_channel_arithmetic(chain, node, tensor, graph):
            return tensor
        tensor = node.outputs[0]


def _fold_per_channel_arithmetic(chain: Chain, node: gs.Node, tensor: gs.Variable, graph: gs.Graph) -> bool:
    """Fold y+c, c+y, y-c, y*c, c*y, y/c (c a per-channel constant) into W and shift; whether it did."""
    if not is_standard(node) or node.op not in ("Add", "Sub", "Mul", "Div") or len(node.inputs) != 2 \
            or (node.op in ("Sub", "Div") and node.inputs[0] is not tensor):
        return False
    value = _per_channel(folded_value(other_operand(node, tensor), graph), chain.weight.shape[0], chain.weight.ndim)
    if value is None or (node.op == "Div" and not np.all(value)):
        return False
    if node.op in ("Add", "Sub"):
        offset = value if node.op == "Add" else -value
        chain.shift = offset if chain.shift is None else chain.shift + offset
    else:
        factor = value if node.op == "Mul" else 1.0 / value
        chain.weight = chain.weight * factor.reshape((-1,) + (1,) * (chain.weight.ndim - 1))
        chain.shift = None if chain.shift is None else chain.shift * factor
    return True


def _fold_batch_norm(chain: Chain, bn: gs.Node, graph: gs.Graph) -> str:
    """Fold an inference-form BatchNormalization into W and shift; the reason it cannot be folded, or ''."""
    if int(bn.attrs.get("training_mode", 0)) or any(consumers(out) for out in bn.outputs[1:]):
        return f"BatchNormalization {bn.name} is in training form (its running statistics are outputs)"
    params = [folded_value(t, graph) for t in bn.inputs[1:5]]
    if any(p is None for p in params):
        return f"BatchNormalization {bn.name} has non-constant parameters"
    channels = chain.weight.shape[0]
    gamma, beta, mean, var = (np.asarray(p, np.float64).reshape(-1) for p in params)
    if not all(p.size == channels for p in (gamma, beta, mean, var)):
        return f"BatchNormalization {bn.name} parameters do not have the Conv's {channels} channels"
    factor = gamma / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    chain.weight = chain.weight * factor.reshape((-1,) + (1,) * (chain.weight.ndim - 1))
    chain.shift = ((0.0 if chain.shift is None else chain.shift) - mean) * factor + beta
    chain.bn_folded += 1
    return ""


def _per_channel(value: np.ndarray | None, channels: int, rank: int) -> np.ndarray | None:
    """A constant that broadcasts over a rank-``rank`` [N, K, ...] output as one value per channel, as float64
    [K]; None for anything else."""
    if value is None or value.dtype.name not in WEIGHT_DTYPES + ("float64",) or value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if shape[0] != 1 or shape[1] not in (1, channels) or any(d != 1 for d in shape[2:]):
        return None
    return np.broadcast_to(value.astype(np.float64).reshape(-1), (channels,)).copy()
