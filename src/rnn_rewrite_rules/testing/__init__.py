"""Graph builders for tests, docs and the demo: exporters' RNN graphs without the exporters."""

from rnn_rewrite_rules.testing.torchlib import RnnConfig, build_torchlib_model, random_inputs

__all__ = ["RnnConfig", "build_torchlib_model", "random_inputs"]
