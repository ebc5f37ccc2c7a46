"""Maintenance tools that are not part of the package: ``tools/corpus`` (the real-model
corpus) and ``tools/mutation`` (mutation testing, ``tox -e mutation``)."""
