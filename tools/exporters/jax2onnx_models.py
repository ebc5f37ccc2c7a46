"""JAX recurrences exported with jax2onnx: ``lax.scan`` over hand-written cells and over
flax nnx ``LSTMCell`` / ``OptimizedLSTMCell`` / ``GRUCell`` / ``SimpleCell``.

    python -m tools.exporters.make jax2onnx [--only NAME ...]

Random weights from a seed per model (hand cells N(0, 0.3); nnx cells their own
initialisers with N(0, 0.3) biases), input features 6, hidden 8, checked at batch 2,
seq 5. Batch and seq are symbolic (``to_onnx(fn, [("T", "B", 6)])``) unless the model
lists them in ``frozen``: then the export fixed them. Each file is checked against the
jitted JAX function at every size the tests run (:mod:`tools.exporters.checks`). What
jax2onnx refuses (``lax.scan(reverse=True)``, ``nnx.RNN``, ``jnp.flip``, an activation
bound before the export) is recorded under the manifest's ``failed`` with its message
and :data:`REFUSALS`.
"""

from __future__ import annotations

import dataclasses
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

F, H, BATCH, SEQ, CLASSES = 6, 8, 2, 5, 3
SCRIPT = "tools/exporters/jax2onnx_models.py"
#: The symbolic dimension names the export gives each role that is not frozen.
SYMBOLS = {"batch": "B", "seq": "T"}

#: How jax2onnx 0.17.1 writes a lax.scan (seen in every scan file).
SCAN_NOTES = (
    "lax.scan -> one Loop: trip count Squeeze(Gather(Shape(x), [0]), [0]) (an int64 "
    "initializer when the shapes are concrete), initial cond a true bool initializer, body "
    "cond out Identity(cond in); x is carried whole (returned by Identity) and x_t = "
    "Gather(x, iteration, axis 0); every weight is a loop-carried value returned by "
    "Identity; each new state leaves the body through Cast(to=FLOAT) of a float value, the "
    "scan output y_t through a second Cast of that Cast; zero initial states Expand(0.0, "
    "Concat(Gather(Shape(x), [1]), [H])) (an LSTM's second one from the Shape of the "
    "first; ConstantOfShape([B, H]) when the shapes are concrete); a time-major y's seq "
    "axis is declared 'JAX2ONNX_DYNAMIC_DIM_SENTINEL'"
)
#: How each cell's step is written (in the Loop body, or once for a step model).
CELL_NOTES = {
    "hand_lstm": (
        "cell: Gemm(x_t, W, C=scalar 0, beta=0) + Gemm(h, U, C=scalar 0, beta=0), plus the "
        "bias (in a Loop body as Expand(Reshape(b, Concat([1], [4H])), Concat([1], [4H])); "
        "outside a plain Add); Split(axis 1) into i, f, g, o; c_t = Add(Mul(Sigmoid(f), c), "
        "Mul(Sigmoid(i), Tanh(g))); h_t = Mul(Sigmoid(o), Tanh(c_t)); carry (h, c)"
    ),
    "hand_gru": (
        "cell: x side Add(Gemm(x_t, W, 0, beta=0), bias) and h side Add(Gemm(h, U, 0, "
        "beta=0), bias) (bias Expand(Reshape(...)) in a Loop body), each Split into z, r, n; "
        "n = Tanh(Add(x_n, Mul(r, h_n))) (linear_before_reset=1); h_t = Add(Mul(Sub(1.0, z), "
        "n), Mul(z, h))"
    ),
    "hand_gru_reset_before": (
        "cell: z, r, n; the carried U and its bias are sliced every step (Slice(U, [0, 0], "
        "[H, 2H]) for z, r; Slice(U, [0, 2H], [H, 3H]) for n; bias Slices then "
        "Expand(Reshape(...))); n = Tanh(Add(Add(x_n, Gemm(Mul(r, h), U_n, 0, beta=0)), c_n)) "
        "(linear_before_reset=0); h_t = Add(Mul(Sub(1.0, z), n), Mul(z, h))"
    ),
    "hand_rnn": (
        "cell: h_t = Tanh(Add(Add(Gemm(x_t, W, 0, beta=0), Gemm(h, U, 0, beta=0)), "
        "Expand(Reshape(b, Concat([1], [H])), Concat([1], [H]))))"
    ),
    "hand_rnn_relu": "cell: as hand_rnn with Relu for Tanh",
    "LSTMCell": (
        "cell: 8 Gemms, one per gate and operand: Add(Gemm(x_t, W_g) (no C, beta=0), "
        "Gemm(h, U_g, b_g) (beta=1)) per gate, in the order i, f, g, o; c_t = "
        "Add(Mul(Sigmoid(f), c), Mul(Sigmoid(i), Tanh(g))); h_t = Mul(Sigmoid(o), Tanh(c_t)); "
        "carry (c, h)"
    ),
    "OptimizedLSTMCell": (
        "cell: Add(Gemm(x_t, W) (no C, beta=0), Gemm(h, U, b) (beta=1)) Split into i, f, g, "
        "o; c_t, h_t as nnx.LSTMCell; carry (c, h)"
    ),
    "GRUCell": (
        "cell: Gemm(x_t, W, b) (beta=1) and Gemm(h, U) (no C, beta=0: no recurrent bias), "
        "each Split into r, z, n; n = Tanh(Add(x_n, Mul(r, h_n))) (linear_before_reset=1, "
        "Rb = 0); h_t = Add(Mul(Sub(1.0, z), n), Mul(z, h))"
    ),
    "SimpleCell": "cell: h_t = Tanh(Add(Gemm(x_t, W, b) (beta=1), Gemm(h, U) (no C, beta=0)))",
    "SimpleCell_relu": "",
}
#: Why jax2onnx refuses the models it refuses, as far as we traced it.
REFUSALS = {
    "hand_lstm_bidirectional_flip": (
        "jnp.flip lowers through a nested jit, and jax2onnx's jit plugin "
        "(plugins/jax/core/jit.py) reads jax._src.core.ClosedJaxpr, which jax 0.12 lacks: "
        "jnp.flip fails anywhere, in a scan or not; x[::-1] and lax.rev export"
    ),
    "nnx_simple_relu": (
        "activation_fn=jax.nn.relu is bound before jax2onnx patches jax.nn.relu, so it lowers "
        "as custom_jvp -> jit and meets the same jit plugin failure; jax.nn.relu looked up "
        "at trace time exports (hand_rnn_relu_batch_major)"
    ),
    "hand_rnn_scan_reverse": "jax2onnx lowers lax.scan only forwards",
    "nnx_rnn_lstm": (
        "nnx.RNN draws its initial carry from an Rngs stream at call time "
        "(LSTMCell.initialize_carry), a state update inside jax2onnx's trace"
    ),
}
#: What a configuration adds to the graph around the Loop.
FORM_NOTES = {
    "batch_major": "jnp.swapaxes -> Transpose(perm [1, 0, 2]) of x before the Loop, of y after",
    "x[::-1]": (
        "x[::-1] -> Gather(x, i, axis 0) with int32 indices i built at run time (Cast(T - 1) + "
        "(-1) * Cast(Range(0, T, 1)), itself reversed by a Gather, so an identity gather), "
        "then Gather(., (T - 1) - Range(0, T, 1), axis 0); the backward y reversed back "
        "the same way; y = Concat(y_forward, y_backward, axis 2)"
    ),
    "lax.rev(x, (0,))": (
        "lax.rev -> Gather(x, Sub(T - 1, Range(0, T, 1)), axis 0) before the backward Loop "
        "and on its y; y = Concat(y_forward, y_backward, axis 2)"
    ),
    "layers": "the second Loop reads the first's y; its zero states read Shape(first y)",
    "initial_states": "the initial states are graph inputs, the Loop's initial carried values",
    "concrete": "concrete shapes: trip count an int64 initializer, zero states ConstantOfShape",
    "head": (
        "nnx.Linear on [B, T, H]: Reshape(y, [-1, H]) -> Gemm(., W, b, beta=1) -> "
        "Reshape(., Concat(Slice(Shape(y), 0, 2), [classes]))"
    ),
    "step": "no Loop: the cell's ops once, the states graph inputs and outputs",
}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One recurrent cell: ``step(carry, x_t) -> (carry, y_t)``, the zero carry of a
    batch, and a name per carry leaf (in the pytree's order)."""

    step: Callable[[Any, Any], tuple[Any, Any]]
    zeros: Callable[[Any], Any]
    states: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Spec:
    """One model: ``build(seed)`` returns the JAX function of the graph inputs, in
    ``inputs`` order, whose flattened result is ``outputs``."""

    source: str
    layer: str
    config: dict
    build: Callable[[int], Callable]
    inputs: dict
    outputs: tuple[str, ...]
    frozen: tuple[str, ...] = ()
    expect: str = "rewrite"
    notes: str = ""

    @property
    def cell(self) -> str:
        """The key of :data:`CELL_NOTES`."""
        kind = self.config["cell"].removeprefix("nnx.")
        return f"{kind}_relu" if self.config.get("activation_fn") else kind

    @property
    def step(self) -> bool:
        return bool(self.config.get("step"))

    def form_notes(self) -> list[str]:
        """:data:`FORM_NOTES` of this configuration, then the cell's, then the scan's."""
        config = self.config
        keys = [
            "batch_major" if config.get("time_major") is False else "",
            config.get("bidirectional", ""),
            "layers" if config.get("layers") else "",
            "initial_states" if config.get("initial_states") else "",
            config.get("shapes", ""),
            "head" if config.get("head") else "",
            "step" if self.step else "",
        ]
        notes = [FORM_NOTES[k] for k in keys if k and k in FORM_NOTES]
        return [*notes, CELL_NOTES[self.cell], "" if self.step else SCAN_NOTES]


# Cells ---------------------------------------------------------------------------------


def _normal(rng, *shape):
    import jax.numpy as jnp

    return jnp.asarray(rng.normal(0, 0.3, shape).astype("float32"))


def _hand_lstm(rng, features: int) -> Cell:
    """Fused gates ``x @ W + h @ U + b`` split i, f, g, o; carry (h, c)."""
    import jax
    import jax.numpy as jnp

    w, u, b = _normal(rng, features, 4 * H), _normal(rng, H, 4 * H), _normal(rng, 4 * H)

    def step(carry, x):
        h, c = carry
        i, f, g, o = jnp.split(x @ w + h @ u + b, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    return Cell(step, lambda batch: (jnp.zeros((batch, H)), jnp.zeros((batch, H))), ("h", "c"))


def _hand_gru(rng, features: int, *, reset_after: bool) -> Cell:
    """Gates z, r, n; ``reset_after``: ``n = tanh(x Wn + bn + r * (h Un + cn))`` (ONNX
    linear_before_reset=1), else ``n = tanh(x Wn + bn + (r * h) Un + cn)``."""
    import jax
    import jax.numpy as jnp

    w, u = _normal(rng, features, 3 * H), _normal(rng, H, 3 * H)
    bw, bu = _normal(rng, 3 * H), _normal(rng, 3 * H)

    def step(h, x):
        xz, xr, xn = jnp.split(x @ w + bw, 3, axis=-1)
        if reset_after:
            hz, hr, hn = jnp.split(h @ u + bu, 3, axis=-1)
        else:
            hz, hr = jnp.split(h @ u[:, : 2 * H] + bu[: 2 * H], 2, axis=-1)
        z, r = jax.nn.sigmoid(xz + hz), jax.nn.sigmoid(xr + hr)
        if reset_after:
            n = jnp.tanh(xn + r * hn)
        else:
            n = jnp.tanh(xn + (r * h) @ u[:, 2 * H :] + bu[2 * H :])
        h = (1.0 - z) * n + z * h
        return h, h

    return Cell(step, lambda batch: jnp.zeros((batch, H)), ("h",))


def _hand_rnn(rng, features: int, *, activation: str = "tanh") -> Cell:
    import jax
    import jax.numpy as jnp

    w, u, b = _normal(rng, features, H), _normal(rng, H, H), _normal(rng, H)

    def step(h, x):
        # Looked up at trace time: jax2onnx patches jax.nn.relu while it traces, and a
        # reference taken before (as a cell's activation_fn) lowers through a jit it
        # cannot read (see nnx_simple_relu).
        z = x @ w + h @ u + b
        h = jax.nn.relu(z) if activation == "relu" else jnp.tanh(z)
        return h, h

    return Cell(step, lambda batch: jnp.zeros((batch, H)), ("h",))


def _nnx_cell(kind: str, seed: int, features: int) -> Cell:
    """flax nnx ``kind`` cell (``<class>_relu``: ``activation_fn=jax.nn.relu``); LSTM
    carries are ``(c, h)``."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    kind, _, activation = kind.partition("_")
    extra = {"activation_fn": jax.nn.relu} if activation == "relu" else {}
    cell = getattr(nnx, kind)(
        features, H, bias_init=nnx.initializers.normal(0.3), rngs=nnx.Rngs(seed), **extra
    )
    if "LSTM" in kind:
        return Cell(cell, lambda batch: (jnp.zeros((batch, H)), jnp.zeros((batch, H))), ("c", "h"))
    return Cell(cell, lambda batch: jnp.zeros((batch, H)), ("h",))


def _cell_factory(kind: str) -> Callable[[int, Any, int], Cell]:
    """``kind``: ``hand_lstm``, ``hand_gru`` (reset after), ``hand_gru_reset_before``,
    ``hand_rnn``, ``hand_rnn_relu``, or an nnx cell class name."""
    hand = {
        "hand_lstm": _hand_lstm,
        "hand_gru": lambda rng, f: _hand_gru(rng, f, reset_after=True),
        "hand_gru_reset_before": lambda rng, f: _hand_gru(rng, f, reset_after=False),
        "hand_rnn": _hand_rnn,
        "hand_rnn_relu": lambda rng, f: _hand_rnn(rng, f, activation="relu"),
    }
    if kind in hand:
        return lambda seed, rng, features: hand[kind](rng, features)
    return lambda seed, rng, features: _nnx_cell(kind, seed, features)


# Models --------------------------------------------------------------------------------


def _scan_model(
    kind: str,
    *,
    batch_major: bool = False,
    layers: int = 1,
    states_in: bool = False,
    bidirectional: str = "",
    head: bool = False,
) -> Callable[[int], Callable]:
    """``lax.scan`` per layer (and per direction: the backward one scans the time-reversed
    x and reverses its outputs back, by ``bidirectional``: ``"flip"`` ``jnp.flip(x, 0)``,
    ``"slice"`` ``x[::-1]``, ``"lax_rev"`` ``lax.rev(x, (0,))``); returns y, then each
    layer's (and direction's) final carry leaves; with ``head`` an ``nnx.Linear`` on y
    instead of y."""

    def build(seed: int) -> Callable:
        import jax
        import jax.numpy as jnp
        import numpy as np
        from flax import nnx
        from jax import lax

        rng = np.random.default_rng(seed)
        make = _cell_factory(kind)
        directions = 2 if bidirectional else 1
        cells = [
            [make(seed + 2 * n + d, rng, H * directions if n else F) for d in range(directions)]
            for n in range(layers)
        ]
        linear = nnx.Linear(H * directions, CLASSES, rngs=nnx.Rngs(seed)) if head else None
        reverse = {
            "flip": lambda v: jnp.flip(v, 0),
            "slice": lambda v: v[::-1],
            "lax_rev": lambda v: lax.rev(v, (0,)),
        }.get(bidirectional)

        def fn(x, *states):
            if batch_major:
                x = jnp.swapaxes(x, 0, 1)
            finals = []
            leaves = list(states)
            for layer in cells:
                ys = []
                for direction, cell in enumerate(layer):
                    if states_in:
                        treedef = jax.tree.structure(cell.zeros(1))
                        carry = jax.tree.unflatten(treedef, leaves[: treedef.num_leaves])
                        leaves = leaves[treedef.num_leaves :]
                    else:
                        carry = cell.zeros(x.shape[1])
                    carry, y = lax.scan(cell.step, carry, reverse(x) if direction else x)
                    ys.append(reverse(y) if direction else y)
                    finals.append(carry)
                x = jnp.concatenate(ys, axis=-1) if len(ys) > 1 else ys[0]
            if batch_major:
                x = jnp.swapaxes(x, 0, 1)
            if linear is not None:
                x = linear(x)
            return x, finals

        return fn

    return build


def _step_model(kind: str) -> Callable[[int], Callable]:
    """One cell step: ``(x_t, *carry) -> new carry`` (a streaming call; y_t is h, and
    jax2onnx refuses two names for one value)."""

    def build(seed: int) -> Callable:
        import jax
        import numpy as np

        rng = np.random.default_rng(seed)
        cell = _cell_factory(kind)(seed, rng, F)
        treedef = jax.tree.structure(cell.zeros(1))

        def fn(x, *states):
            carry, _ = cell.step(jax.tree.unflatten(treedef, states), x)
            return carry

        return fn

    return build


def _reverse_scan(seed: int) -> Callable:
    import numpy as np
    from jax import lax

    cell = _hand_rnn(np.random.default_rng(seed), F)

    def fn(x):
        h, ys = lax.scan(cell.step, cell.zeros(x.shape[1]), x, reverse=True)
        return ys, h

    return fn


def _nnx_rnn(seed: int) -> Callable:
    from flax import nnx

    rnn = nnx.RNN(nnx.LSTMCell(F, H, rngs=nnx.Rngs(seed)), return_carry=True)

    def fn(x):
        carry, ys = rnn(x)
        return ys, carry

    return fn


# The matrix ----------------------------------------------------------------------------

TM = {"x": ["seq", "batch", F]}
BM = {"x": ["batch", "seq", F]}


def _states(names: tuple[str, ...], layers: int = 1) -> dict:
    """Carry-leaf inputs ``<name>0`` (``<name><layer>`` per layer), each [batch, H]."""
    return {f"{n}{layer}": ["batch", H] for layer in range(layers) for n in names}


def _outputs(names: tuple[str, ...], groups: int = 1, y: str | None = "y") -> tuple[str, ...]:
    """y (unless None), then each carry leaf ``<name>_<layer or direction>``."""
    return (*((y,) if y else ()), *(f"{n}_{g}" for g in range(groups) for n in names))


def _specs() -> dict[str, Spec]:
    specs: dict[str, Spec] = {}
    lstm_hand, lstm_nnx, one = ("h", "c"), ("c", "h"), ("h",)

    def add(name: str, source: str, layer: str, config: dict, build, inputs=TM, **kw):
        specs[name] = Spec(source, layer, config, build, inputs, **kw)

    scan = "lax.scan over "
    step = "one call of {} (streaming: the state in and out)"
    step_inputs = {"x": ["batch", F]}
    # hand-written cells
    add(
        "hand_lstm_time_major",
        scan + "a hand-written LSTM cell",
        "LSTM",
        {"cell": "hand_lstm", "time_major": True},
        _scan_model("hand_lstm"),
        outputs=_outputs(lstm_hand),
    )
    add(
        "hand_lstm_batch_major",
        scan + "a hand-written LSTM cell, jnp.swapaxes in and out",
        "LSTM",
        {"cell": "hand_lstm", "time_major": False},
        _scan_model("hand_lstm", batch_major=True),
        inputs=BM,
        outputs=_outputs(lstm_hand),
    )
    add(
        "hand_lstm_initial_states",
        scan + "a hand-written LSTM cell, (h0, c0) as inputs",
        "LSTM",
        {"cell": "hand_lstm", "time_major": True, "initial_states": True},
        _scan_model("hand_lstm", states_in=True),
        inputs={**TM, **_states(lstm_hand)},
        outputs=_outputs(lstm_hand),
    )
    add(
        "hand_lstm_fixed_shapes",
        scan + "a hand-written LSTM cell, concrete shapes",
        "LSTM",
        {"cell": "hand_lstm", "time_major": True, "shapes": "concrete"},
        _scan_model("hand_lstm"),
        outputs=_outputs(lstm_hand),
        frozen=("batch", "seq"),
    )
    add(
        "hand_lstm_stacked2",
        scan + "a hand-written LSTM cell, 2 layers (a scan each)",
        "LSTM",
        {"cell": "hand_lstm", "layers": 2, "time_major": True},
        _scan_model("hand_lstm", layers=2),
        outputs=_outputs(lstm_hand, 2),
    )
    for how, spelled in (("flip", "jnp.flip(x, 0)"), ("slice", "x[::-1]")):
        add(
            f"hand_lstm_bidirectional_{how}",
            scan + f"a hand-written LSTM cell per direction, the backward one over {spelled}",
            "LSTM",
            {"cell": "hand_lstm", "bidirectional": spelled, "time_major": True},
            _scan_model("hand_lstm", bidirectional=how),
            outputs=_outputs(lstm_hand, 2),
        )
    add(
        "hand_gru_time_major",
        scan + "a hand-written GRU cell, r * (h U_n + c_n)",
        "GRU",
        {"cell": "hand_gru", "linear_before_reset": 1, "time_major": True},
        _scan_model("hand_gru"),
        outputs=_outputs(one),
    )
    add(
        "hand_gru_reset_before_initial_state",
        scan + "a hand-written GRU cell, (r * h) U_n, h0 as input, batch-major",
        "GRU",
        {
            "cell": "hand_gru_reset_before",
            "linear_before_reset": 0,
            "time_major": False,
            "initial_states": True,
        },
        _scan_model("hand_gru_reset_before", batch_major=True, states_in=True),
        inputs={**BM, **_states(one)},
        outputs=_outputs(one),
    )
    add(
        "hand_rnn_time_major",
        scan + "a hand-written tanh RNN cell",
        "RNN",
        {"cell": "hand_rnn", "time_major": True},
        _scan_model("hand_rnn"),
        outputs=_outputs(one),
    )
    add(
        "hand_rnn_relu_batch_major",
        scan + "a hand-written relu RNN cell, batch-major",
        "RNN",
        {"cell": "hand_rnn_relu", "time_major": False},
        _scan_model("hand_rnn_relu", batch_major=True),
        inputs=BM,
        outputs=_outputs(one),
    )
    add(
        "hand_rnn_scan_reverse",
        scan + "a hand-written RNN cell with reverse=True",
        "RNN",
        {"cell": "hand_rnn", "reverse": True},
        _reverse_scan,
        outputs=_outputs(one),
    )
    add(
        "hand_lstm_step",
        step.format("a hand-written LSTM cell"),
        "LSTM",
        {"cell": "hand_lstm", "step": True},
        _step_model("hand_lstm"),
        inputs={**step_inputs, **_states(lstm_hand)},
        outputs=_outputs(lstm_hand, y=None),
    )
    add(
        "hand_gru_step",
        step.format("a hand-written GRU cell"),
        "GRU",
        {"cell": "hand_gru", "step": True},
        _step_model("hand_gru"),
        inputs={**step_inputs, **_states(one)},
        outputs=_outputs(one, y=None),
    )
    # flax nnx cells
    add(
        "nnx_lstm_time_major",
        scan + "flax nnx.LSTMCell",
        "LSTM",
        {"cell": "nnx.LSTMCell", "time_major": True},
        _scan_model("LSTMCell"),
        outputs=_outputs(lstm_nnx),
    )
    add(
        "nnx_lstm_batch_major_initial_states",
        scan + "flax nnx.LSTMCell, batch-major, carry (c, h) as inputs",
        "LSTM",
        {"cell": "nnx.LSTMCell", "time_major": False, "initial_states": True},
        _scan_model("LSTMCell", batch_major=True, states_in=True),
        inputs={**BM, **_states(lstm_nnx)},
        outputs=_outputs(lstm_nnx),
    )
    add(
        "nnx_optimized_lstm_time_major",
        scan + "flax nnx.OptimizedLSTMCell",
        "LSTM",
        {"cell": "nnx.OptimizedLSTMCell", "time_major": True},
        _scan_model("OptimizedLSTMCell"),
        outputs=_outputs(lstm_nnx),
    )
    add(
        "nnx_lstm_linear",
        scan + "flax nnx.LSTMCell, then nnx.Linear on every step",
        "LSTM",
        {"cell": "nnx.LSTMCell", "time_major": False, "head": f"Linear({H}, {CLASSES})"},
        _scan_model("LSTMCell", batch_major=True, head=True),
        inputs=BM,
        outputs=_outputs(lstm_nnx, y="logits"),
    )
    add(
        "nnx_gru_batch_major",
        scan + "flax nnx.GRUCell, batch-major",
        "GRU",
        {"cell": "nnx.GRUCell", "time_major": False},
        _scan_model("GRUCell", batch_major=True),
        inputs=BM,
        outputs=_outputs(one),
    )
    add(
        "nnx_gru_stacked2",
        scan + "flax nnx.GRUCell, 2 layers",
        "GRU",
        {"cell": "nnx.GRUCell", "layers": 2, "time_major": True},
        _scan_model("GRUCell", layers=2),
        outputs=_outputs(one, 2),
    )
    add(
        "nnx_gru_bidirectional_lax_rev",
        scan + "flax nnx.GRUCell per direction, the backward one over lax.rev(x, (0,))",
        "GRU",
        {"cell": "nnx.GRUCell", "bidirectional": "lax.rev(x, (0,))", "time_major": True},
        _scan_model("GRUCell", bidirectional="lax_rev"),
        outputs=_outputs(one, 2),
    )
    add(
        "nnx_gru_initial_state",
        scan + "flax nnx.GRUCell, h0 as input",
        "GRU",
        {"cell": "nnx.GRUCell", "time_major": True, "initial_states": True},
        _scan_model("GRUCell", states_in=True),
        inputs={**TM, **_states(one)},
        outputs=_outputs(one),
    )
    add(
        "nnx_simple_time_major",
        scan + "flax nnx.SimpleCell",
        "RNN",
        {"cell": "nnx.SimpleCell", "time_major": True},
        _scan_model("SimpleCell"),
        outputs=_outputs(one),
    )
    add(
        "nnx_simple_relu",
        scan + "flax nnx.SimpleCell(activation_fn=jax.nn.relu)",
        "RNN",
        {"cell": "nnx.SimpleCell", "activation_fn": "jax.nn.relu", "time_major": True},
        _scan_model("SimpleCell_relu"),
        outputs=_outputs(one),
    )
    add(
        "nnx_simple_stacked2_initial_states",
        scan + "flax nnx.SimpleCell, 2 layers, batch-major, h0 per layer as inputs",
        "RNN",
        {"cell": "nnx.SimpleCell", "layers": 2, "time_major": False, "initial_states": True},
        _scan_model("SimpleCell", batch_major=True, layers=2, states_in=True),
        inputs={**BM, **_states(one, 2)},
        outputs=_outputs(one, 2),
    )
    add(
        "nnx_lstm_step",
        step.format("flax nnx.LSTMCell"),
        "LSTM",
        {"cell": "nnx.LSTMCell", "step": True},
        _step_model("LSTMCell"),
        inputs={**step_inputs, **_states(lstm_nnx)},
        outputs=_outputs(lstm_nnx, y=None),
    )
    add(
        "nnx_gru_step",
        step.format("flax nnx.GRUCell"),
        "GRU",
        {"cell": "nnx.GRUCell", "step": True},
        _step_model("GRUCell"),
        inputs={**step_inputs, **_states(one)},
        outputs=_outputs(one, y=None),
    )
    add(
        "nnx_rnn_lstm",
        "flax nnx.RNN(nnx.LSTMCell), batch-major",
        "LSTM",
        {"cell": "nnx.LSTMCell", "module": "nnx.RNN"},
        _nnx_rnn,
        inputs=BM,
        outputs=_outputs(lstm_nnx),
    )
    return specs


SPECS = _specs()


def _axes(spec) -> list:
    return list(spec["axes"] if isinstance(spec, dict) else spec)


def _export(name: str, spec: Spec, path: Path) -> dict:
    import jax
    import numpy as np
    import onnx
    from jax2onnx import to_onnx

    from tools.exporters.checks import check_against_source
    from tools.exporters.manifest import ExportRefused

    seed = zlib.crc32(name.encode())  # stable when models are added
    fn = spec.build(seed)
    sizes = {"batch": BATCH, "seq": SEQ}

    def dim(axis):
        if isinstance(axis, int):
            return axis
        return sizes[axis] if axis in spec.frozen else SYMBOLS[axis]

    shapes = [tuple(dim(a) for a in _axes(axes)) for axes in spec.inputs.values()]
    try:
        model = to_onnx(
            fn,
            shapes,
            model_name=name,
            input_names=list(spec.inputs),
            output_names=list(spec.outputs),
        )
    except Exception as error:  # recorded under the manifest's failed, with what we know
        why = f" ({REFUSALS[name]})" if name in REFUSALS else ""
        raise ExportRefused(f"to_onnx: {type(error).__name__}: {error}{why}") from error
    model.doc_string = ""
    onnx.save(model, str(path))

    # A second build for the source: lax.scan caches its body's trace per function and
    # shapes, and the export's trace holds jax2onnx's primitives, which do not run.
    jitted = jax.jit(spec.build(seed))

    def source(feeds):
        result = jitted(*(feeds[n] for n in spec.inputs))
        return [np.asarray(leaf) for leaf in jax.tree.leaves(result)]

    roles = {a for axes in spec.inputs.values() for a in _axes(axes) if isinstance(a, str)}
    entry = {
        "source": spec.source,
        "layer": spec.layer,
        "config": {
            **spec.config,
            "hidden": H,
            "opset": model.opset_import[0].version,
            "seed": seed,
        },
        "inputs": spec.inputs,
        "export_sizes": {r: sizes[r] for r in sorted(roles)},
        "frozen": list(spec.frozen),
        "expect": spec.expect,
        "notes": "; ".join(n for n in (spec.notes, *spec.form_notes()) if n),
    }
    return check_against_source(path, entry, source, seed=seed)


def _header(exporter: str) -> dict:
    from tools.exporters.manifest import versions

    found = versions("jax", "jaxlib", "jax2onnx", "flax", "onnx", "onnx-ir", "onnxruntime", "numpy")
    return {"exporter": exporter, "versions": found, "script": SCRIPT}


def _models(exporter: str) -> dict:
    if exporter != "jax2onnx":
        raise SystemExit(f"{SCRIPT} exports jax2onnx models, not {exporter}")
    return {name: (lambda path, n=name: _export(n, SPECS[n], path)) for name in SPECS}


if __name__ == "__main__":
    from tools.exporters.manifest import main

    sys.exit(main("tools.exporters.jax2onnx_models", _models, _header))
