"""``tox -e mutation``: restore the verdict store, run mutmut, save the store, report.

    python -m tools.mutation [--changed-since REV] [MUTANT_NAME ...]

Without names or ``--changed-since``, every mutant in ``[tool.mutmut]``'s scope (a run
resumes: mutmut keeps the verdicts of unchanged functions). Names are mutmut's, with
``*`` wildcards; ``--changed-since REV`` adds the functions changed since ``REV``
(:mod:`tools.mutation.changed`).
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Sequence

from tools.mutation import changed, report, verdicts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.mutation", description=__doc__)
    parser.add_argument("names", nargs="*", metavar="MUTANT_NAME")
    parser.add_argument("--changed-since", metavar="REV", help="add the changed functions")
    args = parser.parse_args(argv)
    names = list(args.names)
    if args.changed_since is not None:
        try:
            found = changed.changed_mutants(args.changed_since)
        except RuntimeError as error:
            parser.error(str(error))
        if not found and not names:
            print(f"no mutated function changed since {args.changed_since}")
            return 0
        names += found
    executable = report.mutmut_executable()
    if executable is None:
        parser.error("mutmut is not installed: run this in `tox -e mutation`")
    store = verdicts.store_path()
    mutants = verdicts.ROOT / "mutants"
    if store.exists():
        print(f"restored {len(verdicts.restore(store, mutants))} files' verdicts from {store}")
    code = subprocess.run([executable, "run", "--max-children", "1", *names], check=False)
    if mutants.is_dir():
        print(f"kept {verdicts.save(mutants, store)} verdicts in {store}")
        report.main([])
    return code.returncode


if __name__ == "__main__":
    raise SystemExit(main())
