"""Mutation testing with mutmut: ``tox -e mutation`` (docs/mutation.md)."""
