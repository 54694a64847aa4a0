"""trt_fusedattn::FusedAttention: contract, kernels, launch plan, TensorRT registration."""
