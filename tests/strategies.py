"""Hypothesis strategies over torchlib-shaped RNN models."""

from __future__ import annotations

from hypothesis import strategies as st

from rnn_rewrite_rules.testing import RnnConfig


@st.composite
def rnn_configs(draw, *, fold_limit: int | None = None, max_layers: int = 4) -> RnnConfig:
    """Any LSTM/GRU module torchlib exports: layers, directions, batch_first, bias, states."""
    return RnnConfig(
        op_type=draw(st.sampled_from(["LSTM", "GRU"])),
        input_size=draw(st.integers(1, 24)),
        hidden_size=draw(st.integers(1, 24)),
        num_layers=draw(st.integers(1, max_layers)),
        bidirectional=draw(st.booleans()),
        batch_first=draw(st.booleans()),
        bias=draw(st.booleans()),
        initial_states=draw(st.booleans()),
        opset=draw(st.integers(14, 21)),
        fold_limit=(draw(st.sampled_from([0, 8192])) if fold_limit is None else fold_limit),
        seed=draw(st.integers(0, 2**16)),
    )


#: (batch, seq) pairs: always several, never all equal, so frozen axes show.
sizes = st.lists(
    st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=2, max_size=3, unique=True
).filter(lambda pairs: len({b for b, _ in pairs}) > 1 and len({s for _, s in pairs}) > 1)
