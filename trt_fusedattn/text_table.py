"""Plain-text tables for the terminal (the site table and the verification table share one layout)."""
from __future__ import annotations


def format_table(header, rows) -> str:
    """Left-aligned columns under a dashed rule; empty when there are no rows."""
    if not rows:
        return ""
    cells = [tuple(str(c) for c in header)] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
