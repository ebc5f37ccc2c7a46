"""Graph outputs declared with the sizes the shape prover proves, where it contradicts them.

``torch.onnx.export(dynamo=True)`` declares outputs with the sizes it traced
(``[batch, 17, 128]`` for an axis that follows the dynamic ``seq`` input): ONNX Runtime
then warns on every run at another length, and a reader takes the axis for frozen.

A declared size is a claim: a number, or an input's ``dim_param`` name (that input's
size on that axis); another name or none claims nothing. Where the prover
(:mod:`rnn_rewrite_rules.shape`) proves the size as a polynomial over graph-input sizes
(the declared sizes of the model's inputs) and that polynomial is not the claim, the
claim is false at other input sizes and is rewritten: to the number, to the input's
name when the size is exactly one named input axis, else to an unnamed size. A size the
prover names by an intermediate value proves nothing. A declaration of another rank is
rewritten whole. Inputs' declarations are never changed (an output that is a graph input
is left alone), nor is an output without a declared shape given one.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from rnn_rewrite_rules.shape import Dim, ShapeProver

__all__ = ["DeclaredOutputShapesPass", "OutputShapeFix", "output_shape_fixes"]

#: A declared size: a number, a ``dim_param`` name, or None (unknown).
Size = int | str | None


@dataclasses.dataclass(frozen=True)
class OutputShapeFix:
    """Graph output ``value`` is declared ``declared`` but proven ``proven``."""

    value: ir.Value
    declared: tuple[Size, ...]
    proven: tuple[Size, ...]

    def __str__(self) -> str:
        return f"declared {_text(self.declared)}, proven {_text(self.proven)}"


def _text(sizes: tuple[Size, ...]) -> str:
    return "[" + ", ".join("?" if s is None else str(s) for s in sizes) + "]"


class _InputSizes:
    """The named symbolic axes of the main graph's inputs (those a caller feeds)."""

    def __init__(self, graph: ir.Graph) -> None:
        self.name_of: dict[tuple[int, int], str] = {}
        self.free: set[tuple[int, int]] = set()  # every symbolic input axis, named or not
        self.dims_named: dict[str, list[Dim]] = {}
        for value in graph.inputs:
            if value.is_initializer() or value.shape is None:
                continue
            for axis, size in enumerate(value.shape.dims):
                if isinstance(size, int):
                    continue
                dim = Dim.sym(value, axis)
                key = dim.terms[0][0][0].key
                self.free.add(key)
                name = getattr(size, "value", None)
                if isinstance(name, str) and name:
                    self.name_of.setdefault(key, name)
                    self.dims_named.setdefault(name, []).append(dim)

    def determined(self, dim: Dim) -> bool:
        """True when ``dim`` is a polynomial over input sizes only (a fact at every size)."""
        return all(sym.key in self.free for monomial, _ in dim.terms for sym in monomial)

    def size(self, dim: Dim) -> Size:
        """``dim`` as a declared size: a number, an input axis's name, or None."""
        if dim.value is not None:
            return dim.value
        symbol = dim.symbol
        return None if symbol is None else self.name_of.get(symbol.key)

    def claim(self, size: object) -> list[Dim] | None:
        """The sizes a declared size claims (several inputs may share a name), or None."""
        if isinstance(size, int):
            return [Dim.const(size)]
        name = getattr(size, "value", None)
        return self.dims_named.get(name) if isinstance(name, str) else None


def output_shape_fixes(model: ir.Model) -> list[OutputShapeFix]:
    """Every main-graph output whose declared shape the prover contradicts."""
    graph = model.graph
    inputs = _InputSizes(graph)
    prover = ShapeProver(graph)
    fixes = []
    for value in graph.outputs:
        if value.is_graph_input() or value.is_initializer() or value.shape is None:
            continue
        proven = prover.dims(value)
        if proven is None:
            continue
        declared_dims = list(value.shape.dims)
        declared = tuple(_size(d) for d in declared_dims)
        if len(declared_dims) != len(proven):
            new = tuple(inputs.size(p) if inputs.determined(p) else None for p in proven)
        else:
            new = tuple(
                inputs.size(p) if _contradicts(inputs, d, p) else declared[axis]
                for axis, (d, p) in enumerate(zip(declared_dims, proven, strict=True))
            )
        if new != declared:
            fixes.append(OutputShapeFix(value, declared, new))
    return fixes


def _contradicts(inputs: _InputSizes, declared: object, proven: Dim) -> bool:
    claim = inputs.claim(declared)
    return claim is not None and inputs.determined(proven) and proven not in claim


def _size(dim: object) -> Size:
    return dim if isinstance(dim, int) else getattr(dim, "value", None)


class DeclaredOutputShapesPass(ir.passes.InPlacePass):
    """Writes the proven sizes into refuted output declarations (:func:`output_shape_fixes`)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        fixes = output_shape_fixes(model)
        for fix in fixes:
            fix.value.shape = ir.Shape(list(fix.proven))
        return ir.passes.PassResult(model, modified=bool(fixes))
