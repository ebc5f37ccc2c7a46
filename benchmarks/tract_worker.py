"""Runs models in tract in a child process: a tract panic aborts the process it runs in.

``python tract_worker.py REQUEST.json`` prints one JSON object per line on stdout. It
imports only ``tract`` and ``numpy`` so that it starts fast and tests can use it too.

Requests (JSON):

* ``{"mode": "probe", "models": [{"path": ..., "out_prefix": ...}, ...], "input_names":
  [...], "feeds": [npz, ...]}``: for each model in turn, load it (timed), run it on each
  feed file and save the outputs to ``{out_prefix}{i}.npz`` (``o0``, ``o1``, ...). Lines,
  each with ``"model": index``: ``{"loaded": seconds}``, then ``{"ran": i}`` per feed or
  ``{"error": message, "stage": ...}``, then ``{"finished": true}``; ``{"done": true}`` last.
* ``{"mode": "time", "models": {key: path}, "input_names": [...], "feeds": npz,
  "load_repeats": k, "budget": seconds, "min_rounds": n, "max_rounds": m}``: the best
  load time over ``k`` interleaved loads per model, then per-call latency, interleaved
  across models, best of the rounds. One line: ``{"load": {key: s}, "latency": {key: s}}``.
* ``{"mode": "repeats", "models": {key: path}, "input_names": [...], "feeds": npz,
  "repeats": r, "rounds": n, "sample": seconds}``: per model, its best CPU seconds per call
  (``time.process_time``) in each of ``r`` repeats of ``n`` interleaved rounds
  (``rnn_rewrite_rules.benchmark.best_per_repeat``, what the one-step cost grid reads for
  ONNX Runtime and OpenVINO). One line: ``{"repeats": {key: [s, ...]}}``.

The symbolic batch (and sequence) axes are kept: no input fact is set.
"""

from __future__ import annotations

import json
import math
import sys
import time


def _load(path: str):
    import tract

    return tract.onnx().load(path).into_model().into_runnable()


def _feeds(path: str, names: list[str]) -> list:
    import numpy as np

    with np.load(path) as data:
        return [data[name] for name in names]


def _say(**message) -> None:
    print(json.dumps(message), flush=True)


def _error(error: BaseException) -> str:
    text = str(error).split("Stack backtrace")[0].strip()
    return " ".join(line.strip() for line in text.splitlines() if line.strip())[:600]


def probe(request: dict) -> None:
    import numpy as np

    for number, model in enumerate(request["models"]):
        start = time.perf_counter()
        try:
            runnable = _load(model["path"])
        except Exception as error:
            _say(model=number, error=_error(error), stage="load")
            _say(model=number, finished=True)
            continue
        _say(model=number, loaded=time.perf_counter() - start)
        for index, feeds_path in enumerate(request["feeds"]):
            try:
                outputs = runnable.run(_feeds(feeds_path, request["input_names"]))
                arrays = {f"o{i}": t.to_numpy() for i, t in enumerate(outputs)}
            except Exception as error:
                _say(model=number, error=_error(error), stage=f"run{index}")
                continue
            np.savez(f"{model['out_prefix']}{index}.npz", **arrays)
            _say(model=number, ran=index)
        _say(model=number, finished=True)


def timing(request: dict) -> dict:
    models: dict[str, str] = request["models"]
    load = dict.fromkeys(models, math.inf)
    runnables = {}
    _load(next(iter(models.values())))  # the first load in a process pays one-time set-up
    for _ in range(request.get("load_repeats", 3)):
        for key, path in models.items():
            start = time.perf_counter()
            runnables[key] = _load(path)
            load[key] = min(load[key], time.perf_counter() - start)
    import tract

    inputs = [tract.Tensor.from_numpy(a) for a in _feeds(request["feeds"], request["input_names"])]
    calls = {key: (lambda r=r: r.run(inputs)) for key, r in runnables.items()}
    return {"load": load, "latency": interleaved(calls, **_timing_options(request))}


def repeats(request: dict) -> dict:
    import tract

    from rnn_rewrite_rules.benchmark import best_per_repeat

    runnables = {key: _load(path) for key, path in request["models"].items()}
    inputs = [tract.Tensor.from_numpy(a) for a in _feeds(request["feeds"], request["input_names"])]
    calls = {key: (lambda r=r: r.run(inputs)) for key, r in runnables.items()}
    times = best_per_repeat(
        calls,
        repeats=request["repeats"],
        rounds=request["rounds"],
        sample=request["sample"],
        clock=time.process_time,
    )
    return {"repeats": times}


def _timing_options(request: dict) -> dict:
    return {
        "budget": request.get("budget", 5.0),
        "min_rounds": request.get("min_rounds", 5),
        "max_rounds": request.get("max_rounds", 50),
    }


def interleaved(
    calls: dict,
    *,
    budget: float,
    min_rounds: int,
    max_rounds: int,
    sample: float = 0.002,
    trials: int = 3,
) -> dict:
    """Best seconds per call of each callable, timed in interleaved rounds, and their noise.

    Each callable is warmed up, then one round calls each of them in turn ``inner`` times
    (enough for a ``sample`` of about 2 ms, so timer resolution does not matter); the
    number of rounds fits ``budget`` seconds, clamped to ``[min_rounds, max_rounds]``.
    The rounds are also split into ``trials`` groups (every ``trials``-th round): the
    spread of the per-group bests, ``(max - min) / min``, is how much the best-of-N
    estimate itself moves, the noise of the comparison.
    Returns ``{key: (best, median, rounds, spread)}``.
    """
    single = {}
    for key, call in calls.items():
        call()
        start = time.perf_counter()
        call()
        single[key] = max(time.perf_counter() - start, 1e-7)
    inner = {key: max(1, math.ceil(sample / t)) for key, t in single.items()}
    per_round = sum(inner[k] * single[k] for k in calls)
    rounds = int(min(max_rounds, max(min_rounds, budget // max(per_round, 1e-9))))
    samples: dict = {key: [] for key in calls}
    for _ in range(rounds):
        for key, call in calls.items():
            n = inner[key]
            start = time.perf_counter()
            for _ in range(n):
                call()
            samples[key].append((time.perf_counter() - start) / n)
    groups = max(1, min(trials, rounds))
    result = {}
    for key, values in samples.items():
        bests = [min(values[i::groups]) for i in range(groups)]
        result[key] = (
            min(values),
            sorted(values)[len(values) // 2],
            len(values),
            (max(bests) - min(bests)) / min(bests),
        )
    return result


def main(argv: list[str]) -> int:
    with open(argv[1]) as handle:
        request = json.load(handle)
    if request["mode"] == "probe":
        probe(request)
    elif request["mode"] == "repeats":
        _say(**repeats(request))
    else:
        _say(**timing(request))
    _say(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
