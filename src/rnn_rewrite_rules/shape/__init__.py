"""The shape prover every rule family and ``--check`` share.

* :mod:`.dim`: :class:`Dim`, an exact polynomial over unknown sizes (:class:`Sym`).
* :mod:`.semantics`: ONNX's Reshape, broadcasting and Slice rules on such sizes.
* :mod:`.ops`: one transfer function per op whose facts ONNX's own inference cannot give
  (shape-tensor elements, sizes as polynomials).
* :mod:`.schema`: every other op through ONNX's own shape function, with the prover's
  sizes as symbols (rank, static sizes, sizes passed through).
* :mod:`.prover`: :class:`ShapeProver`, which evaluates a value's :class:`Fact` (its
  sizes, and the content of small int tensors) from the graph alone.
* :mod:`.values`: facts about what a tensor holds (all zeros, finite).
* :mod:`.constant`: the lazy, memory-bounded numeric evaluator of constant subgraphs
  (what ``weight_folding`` folds).

Usage in a rule's check::

    prover = ShapeProver()
    dims = prover.dims(value)          # tuple[Dim, ...] or None (rank unknown)
    target = prover.vector(shape_arg)  # the elements of a Reshape target, or None
"""

from rnn_rewrite_rules.shape.dim import ONE, ZERO, Dim, Sym, known, product
from rnn_rewrite_rules.shape.fact import Fact
from rnn_rewrite_rules.shape.prover import ShapeProver
from rnn_rewrite_rules.shape.semantics import broadcast, normalize_axes, reshape, slice_length

__all__ = [
    "ONE",
    "ZERO",
    "Dim",
    "Fact",
    "ShapeProver",
    "Sym",
    "broadcast",
    "known",
    "normalize_axes",
    "product",
    "reshape",
    "slice_length",
]
