"""onnxscript rewriter rules that make exported ONNX LSTM/GRU/RNN graphs fast and portable.

Three ways in:

* ``onnxscript.rewriter.rewrite(model, pattern_rewrite_rules=rnn_rewrite_rules.rules())``
  or :func:`rnn_rewrite_rules.rewrite` (which also iterates and cleans up);
* :func:`install` before ``torch.onnx.export(..., dynamo=True)`` or
  ``onnxscript.optimizer.optimize()``;
* the ``rnn-rewrite`` command for models on disk.
"""

from rnn_rewrite_rules._api import rewrite, rules
from rnn_rewrite_rules._install import install, installed, is_installed, uninstall

__version__ = "0.1.0"

__all__ = ["__version__", "install", "installed", "is_installed", "rewrite", "rules", "uninstall"]
