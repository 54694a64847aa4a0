"""The custom ops, one folder each: contract, CUDA sources, launch plan, TensorRT registration."""
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.conv.contract import FUSED_CONV

CONTRACTS = (FUSED_ATTENTION, FUSED_CONV)
