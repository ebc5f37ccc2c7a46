"""The one place that reads onnxscript / onnx-ir internals, and the versions they are tested with.

Every other module uses public names only (``onnxscript.rewriter`` exports
``MatchResult``, ``MatchingTracer``, ``MatchStatus``, ``RewriteRule``...). What has no
public name lives here, each with the versions it was read from:

* ``onnxscript.rewriter._DEFAULT_REWRITE_RULES``: the module-level tuple that
  ``optimize_ir`` and ``rewrite(model)`` read at call time (0.5.0 to 0.7.2).
* ``RewriteRule._condition_function`` and ``._replacement_pattern._function``: the
  callables a rule was made from, for its description (0.5.0 to 0.7.2).

Version differences:

* onnxscript >= 0.7.1 runs onnx-ir's ``NameFixPass`` after a rewrite that changed the
  model, which names every ``""`` output again (why ``EmptyUnusedRnnOutputsPass`` runs
  after the rules); earlier releases leave names alone: :data:`REWRITE_NAMES_EMPTY_OUTPUTS`.
* The rewrite builder ``op``: onnxscript <= 0.7.0 passes ``op.op`` to ``onnx_ir.tape.Tape.op
  (op_type, inputs, attributes, domain=...)``; 0.7.1 made it ``op.op(op_type, *inputs,
  _domain=..., _outputs=..., **attributes)``. ``op.<OpType>(*inputs, _domain=...,
  _outputs=..., **attributes)`` means the same in every version: :func:`emit_node`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import Any

import onnx_ir as ir
import onnxscript
import onnxscript.rewriter as _rewriter
from onnxscript.rewriter import RewriteRule

from rnn_rewrite_rules.errors import UnsupportedVersionError

__all__ = [
    "ONNXSCRIPT_BELOW",
    "ONNXSCRIPT_MIN",
    "ONNXSCRIPT_RANGE",
    "REWRITE_NAMES_EMPTY_OUTPUTS",
    "Builder",
    "UnsupportedVersionError",
    "check_onnxscript",
    "default_rewrite_rules",
    "emit_node",
    "gru_export_bug",
    "onnxscript_version",
    "rule_callables",
    "set_default_rewrite_rules",
]

#: The onnxscript releases this package supports (pyproject.toml says the same): CI runs
#: the lowest (.ci/constraints-low.txt) and the highest released. 0.8 is admitted unreleased.
ONNXSCRIPT_MIN = (0, 5, 0)
ONNXSCRIPT_BELOW = (0, 9)
ONNXSCRIPT_RANGE = f">={'.'.join(map(str, ONNXSCRIPT_MIN))},<{'.'.join(map(str, ONNXSCRIPT_BELOW))}"

#: The rewrite builder ``op`` a rule's ``rewrite`` receives: its class differs across the
#: supported releases (see the module doc) and builds each op by attribute
#: (``op.Squeeze(...)``), so it is typed as ``Any``.
Builder = Any

_DEFAULTS = "_DEFAULT_REWRITE_RULES"


def _release(version: str) -> tuple[int, ...]:
    """The leading release numbers of a version string: ``"0.7.3.dev1"`` -> ``(0, 7, 3)``."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def onnxscript_version() -> str:
    try:
        return metadata.version("onnxscript")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source checkout
        return str(getattr(onnxscript, "__version__", "unknown"))


def check_onnxscript(version: str | None = None) -> None:
    """Raise :class:`UnsupportedVersionError` unless onnxscript ``version`` is in the range."""
    version = onnxscript_version() if version is None else version
    release = _release(version)
    if release and release >= ONNXSCRIPT_MIN and release[:2] < ONNXSCRIPT_BELOW:
        return
    raise UnsupportedVersionError(
        f"onnxscript {version} is installed; rnn_rewrite_rules supports onnxscript "
        f"{ONNXSCRIPT_RANGE} (python -m pip install 'onnxscript{ONNXSCRIPT_RANGE}')"
    )


#: The onnxscript releases whose torchlib exports ``nn.GRU`` without
#: ``linear_before_reset=1`` (onnxscript #2852): the model computes another GRU than
#: PyTorch's, off by up to 14%.
GRU_EXPORT_BUG = ((0, 5, 7), (0, 7, 1))


def gru_export_bug(version: str | None = None) -> str | None:
    """What to tell a user whose onnxscript ``version`` exports GRUs wrongly, else None."""
    version = onnxscript_version() if version is None else version
    low, fixed = GRU_EXPORT_BUG
    if not low <= _release(version) < fixed:
        return None
    return (
        f"onnxscript {version} exports torch.nn.GRU without linear_before_reset=1 "
        "(onnxscript #2852): the exported GRU differs from PyTorch's; upgrade with "
        "python -m pip install 'onnxscript>=0.7.1' before exporting"
    )


#: Whether ``RewriteRuleSet.apply_to_model`` names ``""`` outputs (see the module doc).
REWRITE_NAMES_EMPTY_OUTPUTS = _release(onnxscript_version()) >= (0, 7, 1)


def default_rewrite_rules() -> tuple[RewriteRule, ...]:
    """onnxscript's default rules, as ``optimize_ir`` and ``rewrite(model)`` will read them."""
    return tuple(getattr(_rewriter, _DEFAULTS, ()))


def set_default_rewrite_rules(rules: Sequence[RewriteRule]) -> None:
    setattr(_rewriter, _DEFAULTS, tuple(rules))


def rule_parts(rule: RewriteRule) -> tuple[Any, Any, Any, Any]:
    """What ``RewriteRule.__init__`` takes back to make an equal rule: the target pattern,
    the replacement pattern, the condition function and the matcher."""
    return (
        rule._target_pattern,
        rule._replacement_pattern,
        rule._condition_function,
        rule._matcher,
    )


def rule_callables(rule: RewriteRule) -> tuple[Callable | None, Callable | None]:
    """The condition and replacement functions ``rule`` was made from (None when unknown)."""
    condition = getattr(rule, "_condition_function", None)
    replacement = getattr(getattr(rule, "_replacement_pattern", None), "_function", None)
    return condition, replacement


def emit_node(
    op: Builder,
    op_type: str,
    inputs: Sequence[ir.Value | None],
    attributes: Mapping[str, Any],
    *,
    domain: str,
    num_outputs: int,
) -> list[ir.Value]:
    """Add a node to a rewrite's builder ``op``; its outputs as a list (see the module doc).

    ``op_type`` must not name an attribute of the builder (``op``, ``nodes``...).
    """
    if hasattr(type(op), op_type):
        raise ValueError(f"{op_type!r} names an attribute of the rewrite builder")
    outputs = getattr(op, op_type)(*inputs, _domain=domain, _outputs=num_outputs, **attributes)
    return [outputs] if num_outputs == 1 else list(outputs)
