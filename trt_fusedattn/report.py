"""What a run did: each candidate site (fused or the one reason it was not), the verification, the notes.

``Report.table()`` is what ``fuse-onnx`` prints on stdout; ``Report.to_dict()`` is what ``--report`` writes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trt_fusedattn.rewrites import Site
from trt_fusedattn.text_table import format_table

if TYPE_CHECKING:
    from trt_fusedattn.verification import Verification


@dataclass
class Report:
    model: str                                   # where the model came from ("<in memory>" for a ModelProto)
    sites: list[Site] = field(default_factory=list)
    output: str = ""                             # the fused model's path, once saved
    verification: Verification | None = None
    notes: list[str] = field(default_factory=list)  # steps skipped and why (e.g. engine without TensorRT)

    @property
    def fused(self) -> list[Site]:
        return [s for s in self.sites if s.fused]

    def summary(self) -> str:
        by_family = {}
        for site in self.sites:
            done, total = by_family.get(site.family, (0, 0))
            by_family[site.family] = (done + site.fused, total + 1)
        if not by_family:
            return "no attention or convolution sites found: nothing to fuse"
        return ", ".join(f"{family}: {done}/{total} fused" for family, (done, total) in by_family.items())

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "output": self.output,
            "summary": self.summary(),
            "sites": [s.to_dict() for s in self.sites],
            "verification": self.verification.to_dict() if self.verification else None,
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def table(self) -> str:
        """The sites, then the verification, as plain-text tables."""
        rows = [(s.anchor, s.family, "yes" if s.fused else "no", s.op or "-",
                 _details(s), s.reason or "-") for s in self.sites]
        parts = [format_table(("site", "family", "fused", "op", "shapes / details", "reason"), rows),
                 self.summary()]
        if self.verification is not None:
            parts.append(self.verification.table())
        parts.extend(f"note: {note}" for note in self.notes)
        return "\n".join(p for p in parts if p)


def _details(site: Site) -> str:
    shapes = " ".join(f"{k}={_dims(v)}" for k, v in site.shapes.items())
    details = " ".join(f"{k}={v}" for k, v in site.details.items())
    return " ".join(p for p in (shapes, details) if p) or "-"


def _dims(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]" if isinstance(shape, (list, tuple)) else str(shape)

