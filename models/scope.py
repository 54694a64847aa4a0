"""Print the compute ops of one module scope of an exported model (e.g. one attention layer), one line per node,
with weights shown by shape and small constants by value: how models/PATTERNS.md was written.

    python -m models.scope FILE SCOPE [--all]

SCOPE is a substring of the node's module path: TorchScript exports name nodes `/model/encoder/layer.0/attention/...`,
the dynamo exporter records `model.encoder.layer.0.attention` in the node's `namespace` metadata.
"""

from __future__ import annotations

import argparse

import onnx
from onnx import helper, numpy_helper

SHAPE_OPS = {"Constant", "Shape", "Gather", "Unsqueeze", "Concat", "Squeeze", "Slice", "Identity", "Range",
             "ConstantOfShape", "Equal"}


def module_path(node: onnx.NodeProto) -> str | None:
    """The dynamo exporter's `namespace` metadata, else the TorchScript node name (None for unnamed nodes)."""
    for prop in node.metadata_props:
        if prop.key == "namespace":
            return prop.value
    return node.name if node.name.startswith("/") else None


def scope_lines(path: str, scope: str, include_shape_ops: bool = False) -> list[str]:
    """One line per node inside `scope`, plus unnamed nodes (optimizer-made) that lie between its first and last."""
    graph = onnx.load(path).graph
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    producer = {out: node for node in graph.node for out in node.output}
    inside = [i for i, node in enumerate(graph.node) if scope in (module_path(node) or "")]
    if not inside:
        raise SystemExit(f"no node of {path} lies in scope {scope!r}: pass a substring of a node name or namespace")

    def describe(name: str) -> str:
        if not name:
            return "-"
        if name in values:
            array = values[name]
            kind = "W" if name in {i.name for i in graph.initializer} else "c"
            if array.size <= 4:
                return f"{kind}{array.ravel().tolist()}"
            return f"{kind}{list(array.shape)}:{array.dtype}"
        return producer[name].op_type if name in producer else name

    lines = []
    for i in range(inside[0], inside[-1] + 1):
        node = graph.node[i]
        mine = scope in (module_path(node) or "") or module_path(node) is None
        if not mine or (node.op_type in SHAPE_OPS and not include_shape_ops):
            continue
        attrs = []
        for attr in node.attribute:
            value = helper.get_attribute_value(attr)
            if isinstance(value, onnx.TensorProto):
                value = f"{numpy_helper.to_array(value).dtype}"
            elif isinstance(value, bytes):
                value = value.decode()
            attrs.append(f"{attr.name}={value}")
        lines.append(f"{node.op_type}({', '.join(describe(x) for x in node.input)}) {' '.join(attrs)}".rstrip())
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("scope")
    parser.add_argument("--all", action="store_true", help="also print shape arithmetic (Shape, Gather, Concat...)")
    args = parser.parse_args(argv)
    print("\n".join(scope_lines(args.file, args.scope, args.all)))


if __name__ == "__main__":
    main()
