"""The custom ops, one folder each (contract, CUDA sources, launch plan), each described by one ``OpRecord``.

``OPS`` is the one list every consumer loops over (TensorRT registration, verification's custom ops, the pass's
opset declarations, the public API); adding an op is its folder plus one line here."""
from trt_fusedattn.plugins import attention, conv

OPS = (
    attention.OP,
    conv.OP,
)
CONTRACTS = tuple(op.contract for op in OPS)
