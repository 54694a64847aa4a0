"""trt_fusedattn::FusedAttention: contract, kernels, launch plan, and its op record ``OP``."""
from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.plugins.attention.plan import plan_attention
from trt_fusedattn.plugins.op_record import OpRecord


def output_shape_attention(input_shapes, attrs) -> tuple:
    """O's shape: Q's with V's head dim (the last dimension in both layouts)."""
    return (*input_shapes[0][:-1], input_shapes[2][-1])


def output_dtype_attention(input_dtypes, attrs) -> str:
    """O's dtype: Q's."""
    return input_dtypes[0]


OP = OpRecord(FUSED_ATTENTION, plan_attention, output_shape_attention, output_dtype_attention,
              main_inputs=("Q", "K", "V", "mask"), api=("attention", "trt_fusedattn.plugins.attention.api"))
