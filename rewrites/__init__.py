"""Pattern rewrites, one module per family: each finds sites, checks them, replaces each with one custom node.

A family module exposes ``rewrite(graph: onnx_graphsurgeon.Graph) -> list[Site]``: it edits the graph in
place (the driver cleans up and sorts afterwards) and returns one Site per candidate it found, fused or
left alone with one reason. The toolkit the families share: ``CannotFuse`` (the one reason), ``_graph`` (op,
attribute, constant and consumer questions), ``_shapes.TensorShapes`` (one shapes object per pass, passed to
each check that needs dims).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Site:
    """One candidate subgraph: what it is, whether it was fused, and the one reason if it was not."""

    family: str                 # "attention" or "conv"
    anchor: str                 # name of the node the match started from (e.g. the Softmax or the Conv)
    fused: bool
    op: str = ""                # the custom op emitted, e.g. "trt_fusedattn::FusedAttention"
    node: str = ""              # name of the emitted node
    shapes: dict = field(default_factory=dict)   # e.g. {"Q": [1, 8, 128, 64], ...} as far as known
    details: dict = field(default_factory=dict)  # e.g. {"causal": 1, "mask": "bool", "layout": "BSHD"}
    reason: str = ""            # why it was left alone (empty when fused)

    def to_dict(self) -> dict:
        return asdict(self)


class CannotFuse(Exception):
    """A site check failed: the message is the one reason the site is reported as left alone."""


FAMILIES = ("attention", "conv")  # the order the driver runs them in


def run_all(graph, only=None, conv_options: dict | None = None, attention_options: dict | None = None) -> list[Site]:
    """Run each family's rewrite on ``graph`` (all, or those named in ``only``); the sites of all, in order.
    ``conv_options``: the conv rewrite's keywords (target arch and precision of its TensorRT choice);
    ``attention_options``: the attention rewrite's (target arch of its FP8 kernel and TensorRT choice, calibrated
    amax)."""
    from trt_fusedattn.rewrites import attention, conv  # here: they import Site from this module
    from trt_fusedattn.rewrites._folding import fold_cast_likes, fold_constants

    modules = {"attention": attention, "conv": conv}
    fold_cast_likes(graph)
    fold_constants(graph)
    sites = []
    for family in FAMILIES:
        if only is None or family in only:
            options = (conv_options or {}) if family == "conv" else (attention_options or {})
            sites.extend(modules[family].rewrite(graph, **options))
    return sites
