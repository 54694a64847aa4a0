"""trt_fusedattn::FusedAttention: contract, kernels, launch plan, and its op record ``OP``."""
from trt_fusedattn.plugins.attention.contract import (FUSED_ATTENTION, check_attributes, dtype_name, mask_dtype_name,
                                                      output_dtype_name)
from trt_fusedattn.plugins.attention.plan import plan_attention
from trt_fusedattn.plugins.op_record import OpRecord


def output_shape_attention(input_shapes, attrs) -> tuple:
    """O's shape: Q's with V's head dim (the last dimension in both layouts)."""
    return (*input_shapes[0][:-1], input_shapes[2][-1])


def output_dtype_attention(input_dtypes, attrs) -> str:
    """O's dtype: Q's, or ``output_dtype`` for float8e4m3fn Q (auto: float16). Raises a one-line ValueError when the
    dtypes do not fit the contract (FP8 attributes, an additive mask not in the dtype it must have), so TensorRT's
    autotune offers no such combination and its register refuses such a network."""
    q, k, v, mask = input_dtypes[:4]
    check_attributes(q, k, v, attrs)
    if mask is not None and dtype_name(mask) != "bool" and dtype_name(mask) != mask_dtype_name(q, attrs):
        raise ValueError(f"FusedAttention's additive mask must be {mask_dtype_name(q, attrs)} for {dtype_name(q)} Q "
                         f"and these attributes, got {dtype_name(mask)}")
    return output_dtype_name(q, attrs)


OP = OpRecord(FUSED_ATTENTION, plan_attention, output_shape_attention, output_dtype_attention,
              main_inputs=("Q", "K", "V", "mask"), api=("attention", "trt_fusedattn.plugins.attention.api"))
