"""What the prover knows about one value: its sizes, and the content of small int tensors."""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from rnn_rewrite_rules.shape.dim import Dim

__all__ = ["MAX_ELEMENTS", "TRACKED_ELEMENT_TYPES", "UNKNOWN", "Fact"]

#: Content is tracked for int/bool tensors of rank <= 1 with at most this many elements.
MAX_ELEMENTS = 64

#: The integer types whose content is tracked: shape arithmetic's. Arithmetic in a
#: narrower or unsigned type wraps at other bounds (``100 + 100`` is -56 in int8, ``0 -
#: 1`` is ``2**64 - 1`` in uint64), which the prover's integers do not.
TRACKED_ELEMENT_TYPES = frozenset({ir.DataType.INT32, ir.DataType.INT64, ir.DataType.BOOL})


@dataclasses.dataclass(frozen=True)
class Fact:
    """``dims``: one size per axis (None: the rank is unknown; a None size: unknown).

    ``elements``: for a rank-0 or rank-1 integer (or bool, as 0/1) tensor, the value of
    each element as a symbolic size (None where unknown); None when not tracked.

    ``sequence``: for a sequence-typed value (``dims`` None), what every tensor in it is
    known to be; None otherwise or when nothing is known.
    """

    dims: tuple[Dim | None, ...] | None = None
    elements: tuple[Dim | None, ...] | None = None
    sequence: Fact | None = None

    @property
    def rank(self) -> int | None:
        return None if self.dims is None else len(self.dims)

    @staticmethod
    def vector(elements: tuple[Dim | None, ...]) -> Fact:
        return Fact((Dim.const(len(elements)),), elements)

    @staticmethod
    def scalar(element: Dim | None) -> Fact:
        return Fact((), (element,))

    def ints(self) -> list[int] | None:
        """The elements as Python ints when all are constants."""
        if self.elements is None:
            return None
        values = [v for e in self.elements if e is not None and (v := e.value) is not None]
        return values if len(values) == len(self.elements) else None


UNKNOWN = Fact()
