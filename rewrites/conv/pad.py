"""A zero constant Pad in front of a Conv, moved into the Conv's own pads (an equivalent Conv)."""
from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from trt_fusedattn.rewrites._graph import attribute_text, folded_value, is_op, is_present, producer, sole_consumer


def absorb_pad(conv: gs.Node, rank: int, graph: gs.Graph) -> str | None:
    """Move a zero constant-mode Pad of the spatial axes, read only by this Conv, into the Conv's own pads (an
    equivalent Conv; the Pad is removed, its pads' subgraph goes with cleanup). Returns None when no Pad feeds the
    Conv, "" when it was absorbed, else why it stays a node."""
    x, auto_pad = conv.inputs[0], attribute_text(conv, "auto_pad", "NOTSET")
    pad = producer(x)
    if not is_op(pad, "Pad"):
        return None
    if auto_pad not in ("NOTSET", "VALID"):
        return f"the Conv's auto_pad {auto_pad} depends on the padded size"
    if sole_consumer(x, graph) is not conv:
        return f"{x.name} is read by other nodes too"
    mode = attribute_text(pad, "mode", "constant")
    if mode != "constant":
        return f"mode {mode} is not zero padding"
    if len(pad.inputs) < 2 or len(pad.inputs) > 3 and is_present(pad.inputs[3]):
        return "pads as an attribute (opset < 11) or with explicit axes are not read"
    amounts = folded_value(pad.inputs[1], graph)
    value = folded_value(pad.inputs[2], graph) if len(pad.inputs) > 2 and is_present(pad.inputs[2]) else 0.0
    if amounts is None:
        return "its pad amounts are not constant (computed from run-time shapes)"
    if value is None or np.any(value):
        return "its pad value is not the constant 0"
    if amounts.size != 2 * rank or (amounts < 0).any() or amounts[:2].any() or amounts[rank:rank + 2].any():
        return f"pads {amounts.tolist()} are not non-negative pads of the spatial axes only"
    spatial = rank - 2
    own = conv.attrs.get("pads", (0,) * 2 * spatial) if auto_pad == "NOTSET" else (0,) * 2 * spatial
    added = list(amounts[2:rank]) + list(amounts[rank + 2:])
    conv.attrs["pads"] = [int(p) + int(a) for p, a in zip(own, added)]
    conv.attrs["auto_pad"] = "NOTSET"
    conv.inputs[0] = pad.inputs[0]
    pad.inputs.clear()  # so that it is nobody's reader while this pass decides on single consumers
    pad.outputs.clear()
    graph.nodes.remove(pad)
    return ""
