"""What every op's "leave it to TensorRT" table shares: the decision with its evidence, and the arch key a target
maps to. A plugin is only worth putting in an engine where it beats what TensorRT runs without it, so each op
package keeps per-arch evidence (plugins/conv/tensorrt_choice.py, plugins/attention/tensorrt_choice.py) and the
rewrite leaves a site unfused where TensorRT's own fusion is faster on the target."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Choice:
    """The decision for one site on one arch and the evidence behind it; ``op`` names what TensorRT's own fusion
    runs instead ("conv", "attention")."""

    arch: str
    to_tensorrt: bool
    evidence: str
    op: str

    @property
    def reason(self) -> str:
        """The report's line for a site left to TensorRT."""
        return f"left to TensorRT: its fused {self.op} is faster for this shape on {self.arch} ({self.evidence})"


def table_arch(target: str) -> str:
    """The table key of a target: "sm_90a", "sm_90", "90" or "9.0" -> "sm_90" (the arch-specific suffix does not
    change which kernel is faster)."""
    text = str(target).strip().lower()
    found = re.fullmatch(r"(\d+)\.(\d)", text) or re.fullmatch(r"(?:sm_?|compute_)?(\d+)(\d)[af]?", text)
    if not found:
        raise ValueError(f"target {target!r} is not a GPU arch; give one like sm_90a, sm_89 or 9.0")
    return f"sm_{found.group(1)}{found.group(2)}"
