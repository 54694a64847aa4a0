"""The shape of an op contract: domain, name, version, inputs, attributes, output, semantics.

Each custom op states its contract once (``plugins/<op>/contract.py``) with these classes; the rewrite
emits nodes through it, the numpy reference and the verifier read attributes through it, the launch plan
and the TensorRT layer register from it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import onnx
from onnx import helper

DOMAIN = "trt_fusedattn"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, what it holds, whether it may be left out."""

    name: str
    doc: str
    optional: bool = False


@dataclass(frozen=True)
class AttrSpec:
    """One attribute: ONNX type (``int``, ``float``, ``string``, ``ints``), default, allowed values."""

    name: str
    kind: str
    default: Any
    doc: str
    choices: tuple = ()

    def check(self, value: Any) -> Any:
        """Return ``value`` in canonical Python form; raise ValueError when it is not allowed."""
        if self.kind == "int":
            value = int(value)
        elif self.kind == "float":
            value = float(value)
        elif self.kind == "string":
            value = value.decode() if isinstance(value, bytes) else str(value)
        elif self.kind == "ints":
            value = tuple(int(v) for v in value)
        else:  # pragma: no cover - a contract author's mistake
            raise TypeError(f"unknown attribute kind {self.kind!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"attribute {self.name}={value!r} is not one of {self.choices}")
        return value


@dataclass(frozen=True)
class OpContract:
    """A custom op as the graph, the reference, the kernels and TensorRT all see it."""

    name: str
    version: int
    doc: str
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    attributes: Sequence[AttrSpec]
    reference: Callable[..., Any] = field(compare=False, repr=False)
    domain: str = DOMAIN

    @property
    def qualified_name(self) -> str:
        """``domain::name``, the form TensorRT's plugin registry and onnxruntime-extensions use."""
        return f"{self.domain}::{self.name}"

    def attribute(self, name: str) -> AttrSpec:
        for spec in self.attributes:
            if spec.name == name:
                return spec
        raise KeyError(f"{self.qualified_name} has no attribute {name!r}")

    def resolve(self, attrs: Mapping[str, Any]) -> dict:
        """All attributes of a node, defaults filled in, each checked; unknown names are errors."""
        unknown = set(attrs) - {a.name for a in self.attributes}
        if unknown:
            raise ValueError(f"{self.qualified_name} has no attribute(s) {sorted(unknown)}")
        return {a.name: a.check(attrs[a.name]) if a.name in attrs else a.default for a in self.attributes}

    def node_attributes(self, node: onnx.NodeProto) -> dict:
        """The resolved attributes of an ONNX node of this op."""
        return self.resolve({a.name: helper.get_attribute_value(a) for a in node.attribute})

    def is_node(self, node: onnx.NodeProto) -> bool:
        return node.domain == self.domain and node.op_type == self.name

    def explicit_attributes(self, **attrs) -> dict:
        """The given attributes, checked, less those equal to their default (as ONNX leaves them out).

        The form both ``onnx.helper.make_node`` and ``onnx_graphsurgeon.Node(attrs=...)`` take."""
        resolved = self.resolve(attrs)
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in resolved.items() if k in attrs and v != self.attribute(k).default}

    def make_node(self, inputs: Sequence[str], outputs: Sequence[str], name: str = "", **attrs) -> onnx.NodeProto:
        """An ONNX node of this op (a missing optional input in the middle is the empty name ``""``)."""
        if len(inputs) > len(self.inputs):
            raise ValueError(f"{self.qualified_name} takes at most {len(self.inputs)} inputs, got {len(inputs)}")
        return helper.make_node(self.name, list(inputs), list(outputs), name=name or None,
                                domain=self.domain, **self.explicit_attributes(**attrs))

    def opset(self) -> onnx.OperatorSetIdProto:
        return helper.make_opsetid(self.domain, self.version)

    def run_reference(self, node: onnx.NodeProto, *arrays):
        """Evaluate one node of this op on numpy arrays (missing optional inputs passed as None)."""
        return self.reference(*arrays, **self.node_attributes(node))
