"""trt_fusedattn::FusedConv: contract, kernels, launch plan, TensorRT registration."""
