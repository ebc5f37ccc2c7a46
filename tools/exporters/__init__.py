"""Real exporter outputs: scripts that export small random-weight recurrent models with
each exporter at a pinned version, into ``tests/data/exporters/<exporter>/``.

* ``python -m tools.exporters.make EXPORTER [--only NAME ...]`` creates (or reuses) the
  exporter's virtual environment under ``build/exporter-venvs/`` with the pinned versions
  (:data:`tools.exporters.make.EXPORTERS`) and runs ``tools/exporters/<script>.py`` in it.
* Each script exports its models, each in a fresh process, and writes the files and
  ``manifest.json`` (:mod:`tools.exporters.manifest`: the format, merged on ``--only``).
* ``python -m tools.exporters.survey`` rewrites every committed file with the package and
  prints, per exporter, what got smaller and why each recurrence left alone was.

No exporter is a test dependency: ``tests/exporter_files.py`` reads the committed files
with onnx and onnxruntime alone.
"""
