"""What an attention match found: Q, K, V and the output in the forms the graph holds them, the masks, the
scale; and what the sites of one pass share."""
from __future__ import annotations

from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

HEAD_SPLIT = (0, 2, 1, 3)           # BSHD <-> BHSD, its own inverse
KEY_TRANSPOSE = (0, 1, 3, 2)        # BHSD keys -> Kᵀ
SPLIT_KEY_TRANSPOSE = (0, 2, 3, 1)  # BSHD keys -> Kᵀ in one step
FOLDED_KEY_TRANSPOSE = (0, 2, 1)    # [B*H,S,D] keys -> Kᵀ (heads folded into the batch)


@dataclass
class Operand:
    """Q, K or V as the graph holds it: [B,H,S,D] (``bhsd``), [B,S,H,D] (``bshd``), keys as [B,H,D,S]
    (``kt``), [B,S,H*D] with ``heads`` heads (``flat``, the 3-D ONNX Attention form), or with the heads folded
    into the batch: [B*H,S,D] (``folded``), keys as [B*H,D,S] (``folded_kt``), ``heads`` heads."""

    bhsd: gs.Tensor | None = None
    bshd: gs.Tensor | None = None
    kt: gs.Tensor | None = None
    flat: gs.Tensor | None = None
    folded: gs.Tensor | None = None
    folded_kt: gs.Tensor | None = None
    heads: int | None = None
    repeats: int | None = 1  # K/V heads repeated this many times by the graph (GQA, None: unknown), undone
    fp8_scale: float | None = None  # the scale of an FP8 Q/DQ pair peeled off on the way (rewrites/attention/fp8.py)

    def any(self) -> gs.Tensor:
        return next(t for t in (self.bshd, self.bhsd, self.kt, self.flat, self.folded, self.folded_kt)
                    if t is not None)

    def cost(self, layout: str) -> int:
        """Transposes needed to hand this operand over in ``layout``."""
        return 0 if getattr(self, layout.lower()) is not None else 1


@dataclass(frozen=True)
class FilledMask:
    """Where(keep, S, fill) with a finite ``fill`` (finfo.min): masked scores become ``fill``, so a query row with no
    key left averages V. Passed as the additive mask Where(keep, 0, fill), which does the same (``negate``:
    ``keep`` is True where masked)."""

    keep: gs.Tensor
    negate: bool
    fill: float


@dataclass
class Output:
    """The attention output: the tensor consumers read ([B,H,S,D] or, for 3-D Attention, [B,S,H*D]) and the
    [B,S,H,D] tensor of a head-merge Transpose reading it, when all of its readers are such Transposes."""

    bhsd: gs.Tensor | None = None
    bshd: gs.Tensor | None = None
    flat: gs.Tensor | None = None
    folded: gs.Tensor | None = None  # [B*H,S,Dv]: the P·V MatMul of scores with the heads folded into the batch
    producer: gs.Node | None = None
    merges: list = field(default_factory=list)  # head-merge Transposes absorbed in BSHD
    bypassed: list = field(default_factory=list)  # Reshapes of the output to its own shape, between it and merges
    shape_readers: list = field(default_factory=list)  # Shape nodes reading the output (or a bypassed Reshape)

    def cost(self, layout: str) -> int:
        if self.flat is not None or self.folded is not None:
            return 0
        return 0 if layout == "BHSD" or self.bshd is not None else 1


@dataclass
class Match:
    """One site as matched (before its masks are classified and the contract's checks run)."""

    anchor: gs.Node
    q: Operand
    k: Operand
    v: Operand
    out: Output
    scale: float = 0.0                 # 0: the contract's 1/sqrt(D)
    float_masks: list = field(default_factory=list)
    keep_masks: list = field(default_factory=list)  # (tensor, negate): boolean, True = attend (after negate)
    fills: dict = field(default_factory=dict)  # id(keep tensor) -> the finite fill of its Where (else -inf)
    softcap: float = 0.0               # > 0: scores capped as softcap * tanh(s / softcap) before the masks
    folded_heads: int | None = None    # heads of scores computed as [B*H, L_q, L_kv] (1: none split off)
    folded_masks: list = field(default_factory=list)  # [B*H,L,L] masks of folded scores: tensors, (keep, negate),
    #                                                   FilledMasks
    causal: int = 0
    causal_alignment: str = "top_left"
    key_lengths: gs.Tensor | None = None   # valid keys per batch (int64 [B] from ONNX Attention's nonpad_kv_seqlen)
    p_scale: float | None = None       # the scale of an FP8 Q/DQ pair on the probabilities, peeled off
    details: dict = field(default_factory=dict)


@dataclass
class Shared:
    """What the sites of one rewrite share: the names in use, and mask nodes emitted once for all layers."""

    taken: set
    nodes: dict = field(default_factory=dict)  # (op, input ids, attrs) -> output tensor
