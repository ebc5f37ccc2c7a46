"""A model's layout=1 RNNs made layout=0 by the ``layout`` rules alone: what ``--verify``
runs as the reference where ONNX Runtime rejects ``layout=1`` (its CPU kernels do)."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from rnn_rewrite_rules._api import rewrite
from rnn_rewrite_rules._rnn_ops import is_rnn

__all__ = ["time_major_equivalent"]


def time_major_equivalent(before: str | bytes) -> bytes | None:
    """``before`` with its layout=1 RNNs made layout=0 by the ``layout`` rules alone
    (serialized, external data inlined), or None when it has none or they stay."""

    def batch_first(model: ir.Model) -> bool:
        return any(
            is_rnn(node) and node.attributes.get_int("layout", 0) == 1
            for node in model.graph.all_nodes()
        )

    if isinstance(before, bytes):
        model = ir.serde.deserialize_model(onnx.load_from_string(before))
    else:
        model = ir.load(before)
    if not batch_first(model):
        return None
    rewrite(model, ["layout"])
    if batch_first(model):
        return None
    ir.external_data.load_to_model(model)
    return ir.serde.serialize_model(model).SerializeToString()
