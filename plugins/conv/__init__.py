"""trt_fusedattn::FusedConv: contract, kernels, launch plan, and its op record ``OP``."""
from trt_fusedattn.plugins.conv.contract import FUSED_CONV
from trt_fusedattn.plugins.conv.plan import output_dtype_conv, output_shape_conv, plan_conv
from trt_fusedattn.plugins.op_record import OpRecord

OP = OpRecord(FUSED_CONV, plan_conv, output_shape_conv, output_dtype_conv, main_inputs=("X", "W", "residual"),
              channels_last=("X", "residual", "Y"), api=("conv2d", "trt_fusedattn.plugins.conv.api"))
