"""Extend the rules that onnxscript applies by default.

``onnxscript.optimizer.optimize_ir`` (hence ``optimize()`` and
``torch.onnx.export(..., dynamo=True, optimize=True)``) and
``onnxscript.rewriter.rewrite(model)`` without explicit rules all read the
module-level tuple ``onnxscript.rewriter._DEFAULT_REWRITE_RULES`` when they are
called. onnxscript has no public registry, so :func:`install` rebinds that
private tuple (through :mod:`rnn_rewrite_rules._compat`) with our rules in front
(tried first on each node, before onnxscript's ``_materialize_reshape_shape`` can
turn a runtime shape into a constant that freezes an axis). It refuses an
onnxscript outside the tested range (``_compat.ONNXSCRIPT_RANGE``).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator, Sequence

from onnxscript.rewriter import RewriteRule

from rnn_rewrite_rules import _compat
from rnn_rewrite_rules._api import select

__all__ = ["install", "installed", "is_installed", "uninstall"]

_lock = threading.Lock()
_ours: tuple[RewriteRule, ...] = ()
_warned_gru_export = False


def install(
    names: Sequence[str] | str | None = None,
    *,
    target: str | None = None,
    exclude: Sequence[str] | str | None = None,
) -> None:
    """Add our rules to onnxscript's default rules (idempotent).

    Args:
        names: families or rule names (a string is one name); by default every family marked
            ``INSTALL_BY_DEFAULT`` (all but ``layout``, which changes the layout
            attribute a user may rely on).
        target, exclude: as in :func:`rnn_rewrite_rules.rules` (default target
            ``"portable"``: the output runs wherever the original runs).

    Warns once per process (``UserWarning``) where the installed onnxscript exports
    ``nn.GRU`` wrongly (see ``_compat.gru_export_bug``): our rules cannot repair that.

    Raises:
        rnn_rewrite_rules.errors.UnsupportedVersionError: onnxscript is outside the
            tested range (a ``RuntimeError``); nothing is installed.
    """
    global _ours, _warned_gru_export
    _compat.check_onnxscript()
    hazard = _compat.gru_export_bug()
    if hazard is not None and not _warned_gru_export:
        _warned_gru_export = True
        warnings.warn(hazard, UserWarning, stacklevel=2)
    with _lock:
        rules = tuple(select(names, installed_only=True, target=target, exclude=exclude))
        if is_installed() and [r.name for r in rules] == [r.name for r in _ours]:
            return  # the same rules, built anew: keep those installed
        current = [r for r in _compat.default_rewrite_rules() if r not in _ours]
        _ours = rules
        _compat.set_default_rewrite_rules((*rules, *current))


def uninstall() -> None:
    """Remove our rules from onnxscript's defaults; rules others added stay (idempotent)."""
    global _ours
    with _lock:
        if not _ours:
            return
        current = _compat.default_rewrite_rules()
        _compat.set_default_rewrite_rules([r for r in current if r not in _ours])
        _ours = ()


def is_installed() -> bool:
    """Whether our rules are currently part of onnxscript's defaults."""
    current = _compat.default_rewrite_rules()
    return bool(_ours) and all(r in current for r in _ours)


@contextlib.contextmanager
def installed(
    names: Sequence[str] | str | None = None,
    *,
    target: str | None = None,
    exclude: Sequence[str] | str | None = None,
) -> Iterator[None]:
    """Install for the duration of a ``with`` block, restoring the previous state after."""
    was_installed = is_installed()
    previous = [r.name for r in _ours if r.name is not None]  # ours are all named
    install(names, target=target, exclude=exclude)
    try:
        yield
    finally:
        if was_installed:
            install(previous)
        else:
            uninstall()
