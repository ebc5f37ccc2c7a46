"""Where a rewrite stores a constant it makes: an equal tensor already stored, else a new one.

The one home of initializer reuse: the emitters' int64 lists and arrays
(:func:`int64_constant`, :func:`array_constant`) and the weight folder's placement
(``weight_folding``) decide here whether a stored value already holds a tensor
(:func:`holds`), and tag what they store (:func:`tag`) so that a later rewrite finds it
without reading its bits again.

Reuse is decided where a tensor is made because onnx-ir's passes do not do what a
rewrite needs (checked on onnx-ir 0.1.15, the lowest version supported, and 1.1.0):

* ``DeduplicateInitializersPass`` and ``DeduplicateHashedInitializersPass`` merge every
  two equal initializers of a graph, the model's own among them: two equal tensors the
  model keeps apart become one, a change no rule made. They work one graph at a time (a
  tensor folded in both branches of an ``If`` stays twice), see no ``Constant`` node
  (what a fold stores below IR version 4), and log a warning for each initializer that is
  also a graph input (every initializer below IR version 4). Run after the rules, they
  also leave both copies in memory until then.
* ``LiftSubgraphInitializersToMainGraphPass`` moves every initializer of every subgraph
  into the main graph, renaming it on a clash; on 0.1.15 the new name may be a main-graph
  node output's (an invalid model).
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx_ir as ir

from rnn_rewrite_rules._compat import Builder
from rnn_rewrite_rules._ir import fresh_name, same_bits

__all__ = [
    "array_constant",
    "cached_ints",
    "digest",
    "holds",
    "int64_constant",
    "stored_values",
    "tag",
]

#: Key of ``ir.Value.meta`` (in memory only) holding the digest of a tensor a rewrite stored.
_DIGEST_KEY = "rnn_rewrite_rules.initializers.digest"


def digest(array: np.ndarray) -> str:
    """A hash of ``array``'s bytes in C order (its dtype and shape are compared apart)."""
    data = np.ascontiguousarray(array).data.cast("B")
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def tag(value: ir.Value, array_digest: str) -> None:
    """Mark ``value`` as a tensor a rewrite stored, with its :func:`digest`."""
    value.meta[_DIGEST_KEY] = array_digest


def holds(value: ir.Value, array: np.ndarray, array_digest: str, *, raw: bool) -> bool:
    """``value`` is a constant equal to ``array`` that is not an overridable graph input:
    one a rewrite stored with ``array_digest`` (:func:`tag`), or (``raw``) any whose dtype,
    shape and bits are ``array``'s (``_ir.same_bits``)."""
    tensor = value.const_value
    if tensor is None or value.is_graph_input():
        return False
    if tuple(tensor.shape.dims) != array.shape or tensor.dtype.numpy() != array.dtype:
        return False
    if value.meta.get(_DIGEST_KEY) == array_digest:
        return True
    return raw and same_bits(tensor.numpy(), array)


def stored_values(graph: ir.Graph) -> list[ir.Value]:
    """Initializers of ``graph`` and outputs of the ``Constant`` nodes a rewrite stored."""
    values = list(graph.initializers.values())
    values += [
        node.outputs[0]
        for node in graph
        if node.op_type == "Constant" and node.domain == "" and _DIGEST_KEY in node.outputs[0].meta
    ]
    return values


def int64_constant(
    op: Builder, graph: ir.Graph | ir.Function | None, values: list[int], *, as_node: bool = False
) -> ir.Value:
    """An int64 1-D constant: a shared initializer of the main ``graph``, or a ``Constant``.

    Pass ``as_node`` (or no ``graph``) for a subgraph (its names must be unique across the
    whole model, which only the main graph can tell); a function cannot hold initializers
    either. An initializer with the same values that an earlier rewrite made is reused;
    one that is also a graph input is not (a caller may override it), and a new name never
    collides with a graph input, an initializer or any other value.
    """
    if as_node or not isinstance(graph, ir.Graph):
        return op.Constant(value=ir.tensor(np.array(values, dtype=np.int64)))
    base = "rnn_rewrite_rules_" + "_".join(str(v) for v in values).replace("-", "m")
    return _initializer(op, graph, np.array(values, dtype=np.int64), base)


def cached_ints(
    op: Builder,
    graph: ir.Graph | ir.Function | None,
    cache: dict[tuple[int, ...], ir.Value],
    values: list[int],
    *,
    as_node: bool = False,
) -> ir.Value:
    """:func:`int64_constant`, once per value list and rewrite (``cache``): the rewriter adds
    a rewrite's initializers after it, so a second lookup would not find the first."""
    key = tuple(values)
    if key not in cache:
        cache[key] = int64_constant(op, graph, values, as_node=as_node)
    return cache[key]


def array_constant(
    op: Builder, graph: ir.Graph | ir.Function, array: np.ndarray, name: str
) -> ir.Value:
    """``array`` as an initializer named ``name`` (or the first free ``name_1``...), reusing
    an equal one an earlier rewrite made; a ``Constant`` in a function."""
    if not isinstance(graph, ir.Graph):
        return op.Constant(value=ir.tensor(np.asarray(array, order="C")))
    return _initializer(op, graph, array, name)


def _initializer(op: Builder, graph: ir.Graph, array: np.ndarray, base: str) -> ir.Value:
    """The initializer ``base`` (or ``base_1``...) an earlier rewrite made with ``array``'s
    type and values, else a new one named with the first of those names no value uses."""
    array_digest = digest(array)
    name, index = base, 0
    while name in graph.initializers:
        existing = graph.initializers[name]
        if holds(existing, array, array_digest, raw=True):
            return existing
        index += 1
        name = f"{base}_{index}"
    value = op.initializer(ir.tensor(np.asarray(array, order="C")), fresh_name(graph, name))
    tag(value, array_digest)
    return value
