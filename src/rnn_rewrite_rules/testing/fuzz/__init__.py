"""A generative differential fuzzer for the rules (see docs/fuzzing.md).

:func:`~rnn_rewrite_rules.testing.fuzz.generate.fuzz_cases` is a hypothesis strategy of
valid models with recurrences (the builders of :mod:`rnn_rewrite_rules.testing` as cores,
random surroundings and attributes around them);
:func:`~rnn_rewrite_rules.testing.fuzz.oracles.check_case` rewrites one with the public
API and lists what the result gets wrong against the original.
"""
