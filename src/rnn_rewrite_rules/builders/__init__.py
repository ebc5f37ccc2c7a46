"""Model builders that reproduce exporters' RNN graphs without the exporters."""

from rnn_rewrite_rules.builders.torchlib import RnnConfig, build_torchlib_model, random_inputs

__all__ = ["RnnConfig", "build_torchlib_model", "random_inputs"]
