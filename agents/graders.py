"""Graders: a team's reward, defined as data (in the browser) instead of server code.

A grader is a small mapping (its `kind` and that kind's settings). It scores one completion
against one dataset row and returns a `Grade`: a score and its parts, or the reason it could not.

- `exact`: the answer (the `Answer:` line or `\\boxed{}`, or the whole text with `extract: false`)
  is the row's `column`, character for character (surrounding spaces aside).
- `normalized`: the same, with case, runs of spaces, a final full stop and, with
  `ignore_punctuation`, all punctuation ignored.
- `regex`: `pattern` is found in the completion (`fullmatch: true`: the whole answer is it);
  run with the `regex` module's timeout, so a pathological pattern cannot stall a worker.
- `number`: the final number in the completion is the row's `column` within `tolerance`
  (absolute, or relative to the expected value with `relative: true`).
- `json_schema`: the completion holds JSON (a fenced block or the first `{...}`/`[...]`) that
  validates against `schema` (JSON Schema, checked with `jsonschema` when the grader is saved);
  its parts are `parsed` and `valid`.
- `python`: `code` defines `grade(completion, row)` (or `grade(completion, row, turns)`, where
  `turns` lists the earlier turns as `{"role", "text"}`) returning a number in [-1e6, 1e6], or
  `(score, parts)`, or `{"score": ..., "parts": {...}}`, parts mapping at most 16 names to
  numbers. It runs in the sandbox (`agents.sandbox.SandboxWorker`: no network, no file system
  outside a scratch directory, CPU, memory and output limits) in a worker process that is fed
  completions over a pipe and reused (`GraderWorkers`: a task environment keeps one per Python
  grader for the whole run; the try-it form one per try), each completion under its own time
  limit (`timeout_s`); a grader that hangs or crashes fails that completion and the next one gets
  a fresh worker.
- `combination`: `weights` maps other graders of the same set to weights; its score is the
  weighted sum, and its parts are each component's score.

Graders are defined as a set (`{"name": spec, ...}`, so that a combination can name the others);
`check_graders` checks a set before it is stored or run and says what is wrong. A grader that
fails, times out, or returns something that is not a finite number fails that completion's grade
(`Grade.error` says why); callers give it no reward and report the reason, never raise.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import string
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import regex as regex_module

from agents.parsing import answer_number, extract_answer, normalize_number, numbers_equal
from agents.sandbox import SandboxWorker, SandboxWorkerError
from agents.verifiers import extract_json

KINDS: dict[str, str] = {
    "exact": "exact string match",
    "normalized": "string match ignoring case, spacing (and optionally punctuation)",
    "regex": "regular expression",
    "number": "number within a tolerance",
    "json_schema": "JSON valid against a schema",
    "python": "Python function (run in the sandbox)",
    "combination": "weighted combination of other graders",
}
"""Every grader kind and what it does, in the order forms list them."""

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
"""A grader's name: it becomes a chart series (`reward/fn/<name>`) on the run page."""
MAX_GRADERS = 16
MAX_CODE_CHARS = 20_000
MAX_PATTERN_CHARS = 2_000
MAX_PARTS = 16
MAX_SCORE = 1e6
"""A score or part beyond +-MAX_SCORE is refused: one candidate must not swamp a GRPO group."""
DEFAULT_TIMEOUT_S = 2.0
MAX_TIMEOUT_S = 10.0
"""Seconds one completion's Python grade may take (`timeout_s`); the sandbox's start comes on top."""
PYTHON_MEMORY_MB = 256
REGEX_TIMEOUT_S = 0.5
MAX_GRADE_TEXT = 20_000
"""Characters of a completion (and of each earlier turn) a Python grader receives (the tail is kept)."""


class GraderError(ValueError):
    """A grader set is not valid: `field` says where (`graders.check.pattern`), the message what."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.field = where
        self.message = message


@dataclass(frozen=True)
class Grade:
    """What one grader made of one completion."""

    score: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    """Named sub-scores (a Python grader's own, a combination's components, a JSON grader's checks)."""
    error: str | None = None
    """Why there is no score (it raised, timed out, returned NaN...); `score` is then 0."""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Item:
    """One thing to grade: a completion, the row it answers, and the turns before it."""

    completion: str
    row: Mapping[str, Any]
    turns: tuple[tuple[str, str], ...] = ()
    """(role, text) of each earlier turn."""


# ---------------------------------------------------------------- checking a set


def check_graders(graders: Any, *, where: str = "graders") -> dict[str, dict[str, Any]]:
    """The grader set, checked: a mapping of at most MAX_GRADERS names to specs, each of a known
    kind with its settings well-typed (patterns compile, schemas are valid JSON Schema, Python
    code compiles and defines `grade`), combinations naming other graders of the set without a
    cycle. Returns it as plain dicts; raises GraderError naming the field."""
    if not isinstance(graders, Mapping) or not graders:
        raise GraderError(where, "must map grader names to their definitions (at least one)")
    if len(graders) > MAX_GRADERS:
        raise GraderError(where, f"has {len(graders)} graders; the limit is {MAX_GRADERS}")
    checked: dict[str, dict[str, Any]] = {}
    for name, spec in graders.items():
        if not isinstance(name, str) or not NAME.match(name):
            raise GraderError(where, f"{str(name)[:60]!r} is not a grader name: start with a letter; letters, digits, - or _ (at most 40)")
        checked[name] = check_grader(spec, where=f"{where}.{name}", names=tuple(graders))
    for name in checked:
        _check_cycle(checked, name, (), where=where)
    return checked


def check_grader(spec: Any, *, where: str, names: Sequence[str] = ()) -> dict[str, Any]:
    if not isinstance(spec, Mapping):
        raise GraderError(where, "must be a mapping with a `kind`")
    kind = spec.get("kind")
    if kind not in KINDS:
        raise GraderError(f"{where}.kind", f"must be one of {', '.join(KINDS)}, not {kind!r}")
    allowed = {"kind", "description", *_SETTINGS[kind]}
    unknown = sorted(str(k) for k in spec if k not in allowed)
    if unknown:
        raise GraderError(where, f"a {kind} grader takes {', '.join(sorted(allowed - {'kind'}))}; not {', '.join(unknown)}")
    out: dict[str, Any] = {"kind": kind}
    if "description" in spec:
        out["description"] = _text(spec["description"], f"{where}.description", limit=500, empty=True)
    if kind in ("exact", "normalized", "number"):
        out["column"] = _text(spec.get("column", "answer"), f"{where}.column", limit=200)
    if kind in ("exact", "normalized"):
        out["extract"] = _flag(spec.get("extract", True), f"{where}.extract")
    if kind == "normalized":
        out["ignore_punctuation"] = _flag(spec.get("ignore_punctuation", False), f"{where}.ignore_punctuation")
    elif kind == "regex":
        pattern = _text(spec.get("pattern"), f"{where}.pattern", limit=MAX_PATTERN_CHARS)
        try:
            regex_module.compile(pattern, regex_module.DOTALL)
        except regex_module.error as exc:
            raise GraderError(f"{where}.pattern", f"is not a regular expression: {exc}") from None
        out["pattern"] = pattern
        out["fullmatch"] = _flag(spec.get("fullmatch", False), f"{where}.fullmatch")
    elif kind == "number":
        tol = spec.get("tolerance", 1e-6)
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
            raise GraderError(f"{where}.tolerance", f"must be a number of at least 0, not {tol!r}")
        out["tolerance"] = float(tol)
        out["relative"] = _flag(spec.get("relative", False), f"{where}.relative")
    elif kind == "json_schema":
        schema = spec.get("schema")
        if not isinstance(schema, (Mapping, bool)):
            raise GraderError(f"{where}.schema", "must be a JSON Schema (a mapping, like {\"type\": \"object\"})")
        import jsonschema

        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise GraderError(f"{where}.schema", f"is not a valid JSON Schema: {exc.message}") from None
        out["schema"] = schema
    elif kind == "python":
        code = _text(spec.get("code"), f"{where}.code", limit=MAX_CODE_CHARS)
        try:
            tree = compile(code, "grader.py", "exec", flags=0x400, dont_inherit=True)  # ast.PyCF_ONLY_AST: parse, never run
        except (SyntaxError, ValueError) as exc:
            raise GraderError(f"{where}.code", f"does not parse: {exc}") from None
        if not any(getattr(node, "name", None) == "grade" for node in getattr(tree, "body", [])):
            raise GraderError(f"{where}.code", "must define a top-level function grade(completion, row)")
        out["code"] = code
        timeout = spec.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_S:
            raise GraderError(f"{where}.timeout_s", f"must be seconds above 0 and at most {MAX_TIMEOUT_S:g}, not {timeout!r}")
        out["timeout_s"] = float(timeout)
    elif kind == "combination":
        weights = spec.get("weights")
        if not isinstance(weights, Mapping) or not weights:
            raise GraderError(f"{where}.weights", "must map the names of other graders to weights, like {\"exact\": 0.7, \"style\": 0.3}")
        clean: dict[str, float] = {}
        for other, weight in weights.items():
            if other not in names:
                raise GraderError(f"{where}.weights", f"names {str(other)[:60]!r}, which is not a grader of this set ({', '.join(names)})")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or abs(weight) > 1e3:
                raise GraderError(f"{where}.weights.{other}", f"must be a number between -1000 and 1000, not {weight!r}")
            clean[str(other)] = float(weight)
        out["weights"] = clean
    return out


_SETTINGS: dict[str, tuple[str, ...]] = {
    "exact": ("column", "extract"),
    "normalized": ("column", "extract", "ignore_punctuation"),
    "regex": ("pattern", "fullmatch"),
    "number": ("column", "tolerance", "relative"),
    "json_schema": ("schema",),
    "python": ("code", "timeout_s"),
    "combination": ("weights",),
}


def _check_cycle(graders: Mapping[str, Mapping[str, Any]], name: str, path: tuple[str, ...], *, where: str) -> None:
    if name in path:
        raise GraderError(f"{where}.{path[0]}.weights", f"combinations name each other in a circle: {' -> '.join((*path, name))}")
    for other in graders[name].get("weights", {}):
        _check_cycle(graders, other, (*path, name), where=where)


def _text(value: Any, where: str, *, limit: int, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value.strip() and not empty):
        raise GraderError(where, "must be text" + ("" if empty else " (not empty)"))
    if len(value) > limit:
        raise GraderError(where, f"is {len(value):,} characters; the limit is {limit:,}")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise GraderError(where, f"must be true or false, not {value!r}")
    return value


def needs_columns(graders: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> set[str]:
    """The row columns these graders (and the ones their combinations name) read by setting."""
    out: set[str] = set()
    for name in names:
        spec = graders[name]
        if "column" in spec:
            out.add(spec["column"])
        out |= needs_columns(graders, list(spec.get("weights", {})))
    return out


# ---------------------------------------------------------------- grading


def grade_batch(graders: Mapping[str, Mapping[str, Any]], name: str, items: Sequence[Item],
                workers: GraderWorkers | None = None) -> list[Grade]:
    """Grader `name` of the (checked) set on each item. Python graders run in `workers` (a run's:
    one sandbox process per grader, reused across batches), or without, in one process for this
    batch; a combination grades its components on the batch first. Never raises for what the
    grader does: a failure is that item's `Grade.error`."""
    spec = graders[name]
    kind = spec["kind"]
    if kind == "python":
        return _python_batch(spec, items, workers)
    if kind == "combination":
        parts_of = {other: grade_batch(graders, other, items, workers) for other in spec["weights"]}
        grades = []
        for i in range(len(items)):
            components = {other: parts_of[other][i] for other in spec["weights"]}
            failed = [f"{other}: {g.error}" for other, g in components.items() if not g.ok]
            if failed:
                grades.append(Grade(error="; ".join(failed)))
                continue
            score = sum(spec["weights"][other] * g.score for other, g in components.items())
            grades.append(Grade(score=score, parts={other: g.score for other, g in components.items()}))
        return grades
    return [_grade_one(spec, item) for item in items]


def _expected(spec: Mapping[str, Any], row: Mapping[str, Any]) -> tuple[Any, str | None]:
    column = spec["column"]
    if column not in row or row[column] is None:
        have = ", ".join(sorted(map(str, row))) or "none"
        return None, f"the row has no column {column!r} (it has: {have})"
    return row[column], None


def _grade_one(spec: Mapping[str, Any], item: Item) -> Grade:
    kind, text = spec["kind"], item.completion
    if kind in ("exact", "normalized", "number"):
        expected, problem = _expected(spec, item.row)
        if problem:
            return Grade(error=problem)
    if kind in ("exact", "normalized"):
        got = extract_answer(text) if spec["extract"] else text
        if got is None:
            return Grade(0.0)
        if kind == "exact":
            return Grade(float(got.strip() == str(expected).strip()))
        return Grade(float(_normal(got, spec["ignore_punctuation"]) == _normal(str(expected), spec["ignore_punctuation"])))
    if kind == "regex":
        try:
            rx = regex_module.compile(spec["pattern"], regex_module.DOTALL)
            found = (rx.fullmatch((extract_answer(text) or text).strip(), timeout=REGEX_TIMEOUT_S) if spec["fullmatch"]
                     else rx.search(text, timeout=REGEX_TIMEOUT_S))
        except TimeoutError:
            return Grade(error=f"the pattern took longer than {REGEX_TIMEOUT_S:g} s on this text")
        return Grade(float(found is not None))
    if kind == "number":
        gold = expected if isinstance(expected, (int, float)) and not isinstance(expected, bool) else normalize_number(str(expected))
        if gold is None:
            return Grade(error=f"the row's {spec['column']!r} is not a number: {str(expected)[:60]!r}")
        got_n = answer_number(text)
        if got_n is None:
            return Grade(0.0)
        tol = spec["tolerance"] * (abs(float(gold)) if spec["relative"] else 1.0)
        return Grade(float(abs(float(got_n) - float(gold)) <= tol or numbers_equal(got_n, gold, tol=0.0)))
    if kind == "json_schema":
        import jsonschema

        try:
            value = extract_json(text)
        except ValueError:
            value = None
        if value is None:
            return Grade(0.0, {"parsed": 0.0, "valid": 0.0})
        validator = jsonschema.validators.validator_for(spec["schema"])(spec["schema"])
        valid = validator.is_valid(value)
        return Grade(float(valid), {"parsed": 1.0, "valid": float(valid)})
    raise ValueError(f"unknown grader kind {kind!r}")


_PUNCTUATION = str.maketrans("", "", string.punctuation)


def _normal(text: str, ignore_punctuation: bool) -> str:
    text = " ".join(text.strip().split()).rstrip(".").casefold()
    return " ".join(text.translate(_PUNCTUATION).split()) if ignore_punctuation else text


# ---------------------------------------------------------------- Python graders in the sandbox

_HARNESS = r"""
import io, json, math, signal, sys, contextlib
MARK = __MARK__
PER_ITEM_S = __PER_ITEM_S__
MAX_SCORE = __MAX_SCORE__
MAX_PARTS = __MAX_PARTS__
out = sys.stdout
def emit(obj):
    out.write(MARK + json.dumps(obj) + "\n")
    out.flush()
class TookTooLong(BaseException):
    pass
def on_alarm(signum, frame):
    raise TookTooLong()
signal.signal(signal.SIGALRM, on_alarm)
def number(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} is {type(value).__name__} {str(value)[:40]!r}, not a number")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{what} is {value}, not a finite number")
    if abs(value) > MAX_SCORE:
        raise ValueError(f"{what} is {value:g}, beyond +-{MAX_SCORE:g}")
    return value
def check(value):
    parts = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise TypeError("returned a mapping without 'score'")
        score, parts = value["score"], value.get("parts") or {}
    elif isinstance(value, tuple) and len(value) == 2:
        score, parts = value
    else:
        score = value
    score = number(score, "the score")
    if not isinstance(parts, dict):
        raise TypeError(f"the parts are {type(parts).__name__}, not a mapping of names to numbers")
    if len(parts) > MAX_PARTS:
        raise ValueError(f"returned {len(parts)} parts; the limit is {MAX_PARTS}")
    clean = {}
    for key, part in parts.items():
        if not isinstance(key, str) or not key or len(key) > 40:
            raise TypeError(f"a part's name must be text of 1 to 40 characters, not {str(key)[:40]!r}")
        clean[key] = number(part, f"part {key!r}")
    return {"score": score, "parts": clean}
def describe(exc):
    text = f"{type(exc).__name__}: {exc}"
    return text[:300]
namespace = {"__name__": "grader"}
first = sys.stdin.readline()
signal.setitimer(signal.ITIMER_REAL, PER_ITEM_S)
try:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        exec(compile(json.loads(first)["code"], "grader.py", "exec"), namespace)
    signal.setitimer(signal.ITIMER_REAL, 0)
    fn = namespace.get("grade")
    if not callable(fn):
        raise TypeError("the code defines no function grade(completion, row)")
    code = getattr(fn, "__code__", None)
    with_turns = code is not None and (code.co_argcount >= 3 or bool(code.co_flags & 0x04))
except BaseException as exc:
    signal.setitimer(signal.ITIMER_REAL, 0)
    emit({"setup": "took longer than %g s to load" % PER_ITEM_S if isinstance(exc, TookTooLong) else describe(exc)})
    raise SystemExit(0)
emit({"ready": True})
while True:
    line = sys.stdin.readline()
    if not line:  # the parent closed the pipe (or died): nothing more to grade
        break
    item = json.loads(line)
    try:
        sink = io.StringIO()
        signal.setitimer(signal.ITIMER_REAL, PER_ITEM_S)
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            args = (item["completion"], item["row"]) + ((item["turns"],) if with_turns else ())
            result = check(fn(*args))
        signal.setitimer(signal.ITIMER_REAL, 0)
    except TookTooLong:
        result = {"error": "took longer than %g s" % PER_ITEM_S}
    except BaseException as exc:
        signal.setitimer(signal.ITIMER_REAL, 0)
        result = {"error": "raised " + describe(exc)}
    emit({"n": item["n"], **result})
"""

START_S = 3.0
"""Seconds a Python grader's worker may take to start and load the grader's code, on top of `timeout_s`."""
GRACE_S = 1.0
"""Seconds past `timeout_s` before the parent kills a worker whose grader swallowed its own timer."""
WORKER_CPU_S = 60
"""A worker's CPU rlimit, for its whole life. The server counts the wall time of each of its requests
(more than the CPU the single-threaded process can have spent; it spends none while it waits for the
next) and replaces it before that count could pass the limit, so a grader is never stopped by it;
what it bounds is a worker whose server died while its grader spins with its own timer ignored."""


class GraderWorkers:
    """The sandboxed processes that run a set's Python graders: one per grader (its code and
    `timeout_s`), started at its first completion and reused for every later one, in every batch
    graded with this object (a task environment keeps one for the whole run, so a step costs no
    sandbox start at all after the first). Each completion is one request to the worker under its
    own timer (`timeout_s` inside, plus `GRACE_S` from the parent); a grader that hangs, crashes or
    breaks a limit fails that completion with the reason, its worker is killed, and the next
    completion gets a fresh one. `close()` kills them all (the run's end, failure or stop); it is
    also done at garbage collection and at interpreter exit. Thread-safe (one batch at a time per
    grader); a copy sent to another process (pickling) starts empty."""

    def __init__(self) -> None:
        self._workers: dict[tuple[str, float], tuple[SandboxWorker, list[float]]] = {}
        self._broken: dict[tuple[str, float], Grade] = {}
        """Graders whose code raised while loading: every later completion gets that reason, with no new start."""
        self._lock = threading.Lock()
        self.started = 0
        """How many sandbox processes were started (a bench and test counter)."""

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def grade(self, spec: Mapping[str, Any], items: Sequence[Item]) -> list[Grade]:
        per_item = float(spec.get("timeout_s", DEFAULT_TIMEOUT_S))
        key = (spec["code"], per_item)
        with self._lock:
            return [self._grade_one(key, item, i) for i, item in enumerate(items)]

    def _worker(self, key: tuple[str, float]) -> tuple[SandboxWorker, list[float]] | Grade:
        if key in self._broken:
            return self._broken[key]
        held = self._workers.get(key)
        if held is not None and held[0].alive and held[1][0] + key[1] + GRACE_S < WORKER_CPU_S - 1:
            return held
        if held is not None:
            held[0].close()
            del self._workers[key]
        code, per_item = key
        mark = "@@grade-" + secrets.token_hex(8) + "@@"
        harness = (_HARNESS.replace("__MARK__", repr(mark)).replace("__PER_ITEM_S__", repr(per_item))
                   .replace("__MAX_SCORE__", repr(MAX_SCORE)).replace("__MAX_PARTS__", repr(MAX_PARTS)))
        worker = SandboxWorker(harness, cpu_s=WORKER_CPU_S, memory_mb=PYTHON_MEMORY_MB, max_reply_bytes=8192, reply_prefix=mark)
        self.started += 1
        began = time.monotonic()
        try:
            reply = json.loads(worker.request(json.dumps({"code": code}), timeout_s=START_S + per_item))
        except SandboxWorkerError as exc:  # not remembered: a busy machine's slow start is tried again
            return Grade(error=f"the grader's code failed: {_worker_reason(exc.reason, per_item)}")
        if "setup" in reply:
            worker.close()
            self._broken[key] = Grade(error=f"the grader's code failed: {reply['setup']}")
            return self._broken[key]
        held = (worker, [time.monotonic() - began])
        self._workers[key] = held
        return held

    def _grade_one(self, key: tuple[str, float], item: Item, n: int) -> Grade:
        held = self._worker(key)
        if isinstance(held, Grade):
            return held
        worker, spent = held
        request = {"n": n, "completion": item.completion[-MAX_GRADE_TEXT:], "row": _plain(item.row),
                   "turns": [{"role": role, "text": text[-MAX_GRADE_TEXT:]} for role, text in item.turns]}
        began = time.monotonic()
        try:
            reply = worker.request(json.dumps(request), timeout_s=key[1] + GRACE_S)
        except SandboxWorkerError as exc:
            del self._workers[key]
            return Grade(error=_worker_reason(exc.reason, key[1]))
        finally:
            spent[0] += time.monotonic() - began
        try:
            record = json.loads(reply)
        except ValueError:
            worker.close()
            del self._workers[key]
            return Grade(error="the grader's process answered something that is not JSON")
        if record.get("n") != n:
            worker.close()
            del self._workers[key]
            return Grade(error="the grader's process answered out of turn")
        if "error" in record:
            return Grade(error=str(record["error"]))
        return Grade(float(record["score"]), {str(k): float(v) for k, v in record["parts"].items()})

    def close(self) -> None:
        with self._lock:
            for worker, _ in self._workers.values():
                worker.close()
            self._workers.clear()

    def __enter__(self) -> GraderWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _python_batch(spec: Mapping[str, Any], items: Sequence[Item], workers: GraderWorkers | None) -> list[Grade]:
    """A Python grader on every item, in `workers` (or, without, in one worker for this batch)."""
    if not items:
        return []
    if workers is not None:
        return workers.grade(spec, items)
    with GraderWorkers() as own:
        return own.grade(spec, items)


def _worker_reason(reason: str, per_item: float) -> str:
    if reason == "timeout":
        return f"took longer than {per_item:g} s and its process was stopped"
    return f"the grader's process was stopped: {reason}"


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row as JSON can carry it (what a Python grader receives as `row`)."""
    return json.loads(json.dumps(dict(row), default=str))


def grade_all(graders: Mapping[str, Mapping[str, Any]], items: Sequence[Item], names: Sequence[str] | None = None) -> dict[str, list[Grade]]:
    """Every grader (or those named) on the items: what the try-it form shows."""
    with GraderWorkers() as workers:
        return {name: grade_batch(graders, name, items, workers) for name in (names or list(graders))}
