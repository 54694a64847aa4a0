"""TensorRT's symbolic dimensions as plan functions use them: ints where TensorRT knows the value at build time,
else a ``SymbolicDim`` that supports ``+ - * //`` with ints on either side (TensorRT's ``ShapeExpr`` only supports
the expression on the left) and refuses anything that would need the value (``bool``, comparisons, ``%``)."""
from __future__ import annotations


class SymbolicDim:
    """A dimension known only at run time, wrapping a ``tensorrt.plugin.ShapeExpr``."""

    __slots__ = ("expr",)

    def __init__(self, expr):
        self.expr = expr

    @staticmethod
    def _unwrap(other):
        if isinstance(other, SymbolicDim):
            return other.expr
        if isinstance(other, int) and not isinstance(other, bool):
            return other
        return NotImplemented

    def _lift(self, value: int):
        """An int as a constant expression (so it can stand on the left of an operation)."""
        return type(self.expr)(value)

    def __add__(self, other):
        o = self._unwrap(other)
        return NotImplemented if o is NotImplemented else SymbolicDim(self.expr + o)

    __radd__ = __add__

    def __mul__(self, other):
        o = self._unwrap(other)
        return NotImplemented if o is NotImplemented else SymbolicDim(self.expr * o)

    __rmul__ = __mul__

    def __sub__(self, other):
        o = self._unwrap(other)
        return NotImplemented if o is NotImplemented else SymbolicDim(self.expr - o)

    def __rsub__(self, other):
        o = self._unwrap(other)
        return NotImplemented if o is NotImplemented else SymbolicDim(self._lift(o) - self.expr)

    def __floordiv__(self, other):
        o = self._unwrap(other)
        return NotImplemented if o is NotImplemented else SymbolicDim(self.expr // o)

    def __rfloordiv__(self, other):
        o = self._unwrap(other)
        return NotImplemented if o is NotImplemented else SymbolicDim(self._lift(o) // self.expr)

    def _needs_value(self, *_):
        raise ValueError("this dimension is only known at run time in TensorRT (symbolic): a plan may use only "
                         "+ - * // on it; check isinstance(d, int) before comparing or branching")

    __bool__ = __index__ = __int__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __mod__ = _needs_value
    __hash__ = None

    def __repr__(self):
        return f"SymbolicDim({self.expr!r})"


def plan_dim(expr):
    """What a plan function sees of one TensorRT dimension: its int value when constant, else a SymbolicDim."""
    if not getattr(expr, "is_fake", False) and expr.is_constant:
        return int(expr.constant_value())
    return SymbolicDim(expr)


def plan_shape(shape_expr) -> tuple:
    return tuple(plan_dim(e) for e in shape_expr)


def trt_value(value):
    """A plan's int or SymbolicDim as TensorRT takes it (``ShapeExpr``, a ``SymInt32``, or the int)."""
    if isinstance(value, SymbolicDim):
        return value.expr
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a launch parameter is {value!r}: plans give ints or dimension expressions")
    return value
