"""Attention family: each Softmax(scale·Q·Kᵀ + mask)·V subgraph and each ONNX ``Attention`` node becomes one
``trt_fusedattn::FusedAttention`` node.

Sites are matched by dataflow, not by names, one rule per anchor: ``softmax`` (a Softmax between Q·Kᵀ and P·V)
and ``onnx_attention`` (the opset-23 op). ``operands`` traces Q, K, V and the output (scales folded into
``scale``, Kᵀ forms and K/V head repeats undone, head split/merge Transposes absorbed); ``masks`` turns causal
triangles into ``causal`` and passes the rest; ``checks`` holds what the contract needs of the dims and dtypes;
``emission`` writes the node in the layout needing the fewest new Transposes. A site whose checks fail is left
as it was and reported with one reason.
"""
from __future__ import annotations

import onnx_graphsurgeon as gs

from trt_fusedattn.plugins.attention.contract import FUSED_ATTENTION
from trt_fusedattn.rewrites import CannotFuse, Site
from trt_fusedattn.rewrites._graph import is_op, names_in_use
from trt_fusedattn.rewrites._shapes import TensorShapes
from trt_fusedattn.rewrites.attention.checks import check, sequence_lengths
from trt_fusedattn.rewrites.attention.emission import replace
from trt_fusedattn.rewrites.attention.masks import classify_masks
from trt_fusedattn.rewrites.attention.match import Match, Shared
from trt_fusedattn.rewrites.attention.onnx_attention import match_onnx_attention
from trt_fusedattn.rewrites.attention.softmax import match_softmax, weights_values

FAMILY = "attention"


def _site_shapes(match: Match, shapes: TensorShapes) -> dict:
    """Shapes of Q, K, V as the match found them (a site left alone reports these)."""
    return _reported({name: op.any() for name, op in (("Q", match.q), ("K", match.k), ("V", match.v))}, shapes)


def _reported(tensors: dict, shapes: TensorShapes) -> dict:
    """The dims of each named tensor a Site shows, those known only."""
    return {name: shapes.report_recorded(t) for name, t in tensors.items() if shapes.report_recorded(t) is not None}


def _fuse(anchor: gs.Node, graph: gs.Graph, shared: Shared, shapes: TensorShapes) -> Site:
    """Match, check and replace the site ``anchor`` starts; the Site says what was done or the one reason not."""
    site = Site(family=FAMILY, anchor=anchor.name, fused=False)
    try:
        rule = match_softmax if anchor.op == "Softmax" else match_onnx_attention
        match = rule(anchor, graph, shapes)
        site.shapes = _site_shapes(match, shapes)
        classify_masks(match, *sequence_lengths(match, shapes), shared, shapes)
        check(match, shapes)
        node = replace(match, graph, shared)
    except CannotFuse as reason:
        site.reason = str(reason)
        return site
    site.fused, site.op, site.node, site.details = True, FUSED_ATTENTION.qualified_name, node.name, match.details
    tensors = dict(zip(("Q", "K", "V", "mask", "key_lengths"), node.inputs), O=node.outputs[0])
    site.shapes = _reported(tensors, shapes)
    return site


def rewrite(graph: gs.Graph) -> list[Site]:
    """Fuse every attention site of ``graph`` in place; one Site per ONNX Attention node and per Softmax whose
    probabilities weight values (a Softmax that does not, such as a MoE router or a classifier head, is no site)."""
    shared = Shared(names_in_use(graph))
    anchors = [n for n in graph.nodes if is_op(n, "Attention") or is_op(n, "Softmax") and weights_values(n)]
    if not anchors:
        return []
    shapes = TensorShapes(graph, symbolic=True)
    return [_fuse(anchor, graph, shared, shapes) for anchor in anchors]
