"""onnxscript rewriter rules that make exported ONNX LSTM/GRU/RNN graphs fast and portable.

Three ways in:

* ``onnxscript.rewriter.rewrite(model, pattern_rewrite_rules=rnn_rewrite_rules.rules())``
  or :func:`rnn_rewrite_rules.rewrite` (which also iterates and cleans up);
* :func:`install` before ``torch.onnx.export(..., dynamo=True)`` or
  ``onnxscript.optimizer.optimize()``;
* :func:`rewrite_file` for models on disk, or the ``rnn-rewrite`` command built on it.
"""

from rnn_rewrite_rules._api import rewrite, rules
from rnn_rewrite_rules._install import install, installed, is_installed, uninstall
from rnn_rewrite_rules._rewrite_file import Report, RewriteOptions, rewrite_file

__version__ = "0.1.0"

__all__ = [
    "Report",
    "RewriteOptions",
    "__version__",
    "install",
    "installed",
    "is_installed",
    "rewrite",
    "rewrite_file",
    "rules",
    "uninstall",
]
