"""The benchmark suite: ``python -m benchmarks.run`` (see docs/benchmarks.md)."""
