"""Verifiers: score a model's text against what a dataset row expects.

Each verifier is a plain function returning a score in [0, 1]:

- `exact(text, expected)`: the extracted answer equals `expected` (whitespace- and case-insensitive).
- `numeric(text, expected, tol=...)`: the answer is the same number (`"1,000"` == `1000.0`).
- `math_equiv(text, expected)`: mathematically equivalent, decided by math-verify
  (`\\frac{1}{2}` == `0.5`, `x^2+1` == `1+x^2`).
- `regex(text, pattern)`: the pattern matches.
- `json_match(text, required_keys=..., expected=...)`: the text holds valid JSON; with
  `expected`, equal to it; with `required_keys`, the fraction of those keys present.
- `unit_tests(text, tests)`: the fraction of the test statements that pass when the code in
  `text` and then `tests` run in the sandbox.

Each has a TRL-style reward function factory (`numeric_reward(tol=...)` and so on) returning
`fn(prompts, completions, **columns) -> list[float]`, where `completions` are strings or chat
message lists and `columns` are the dataset columns, one value per completion. Ready-made
instances with the default settings can be named in a config as plugin paths:
`agents.verifiers:exact_answer`, `:numeric_answer`, `:math_answer`, `:json_valid`,
`:unit_tests_passed` (always available). `load_reward_fn("pkg.mod:func")` returns one of those
or a reward function the operator registered (see `agents.plugins`).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agents.parsing import answer_number, extract_answer, extract_code, normalize_number, numbers_equal
from agents.plugins import REWARD_FUNCTION, PluginError, lookup
from agents.sandbox import SandboxResult, run_python

RewardFn = Callable[..., list[float]]
"""`fn(prompts, completions, **columns) -> list[float]`, as TRL's GRPOTrainer calls reward functions."""

_MISSING: Any = object()


# ---------------------------------------------------------------- verifiers


def _norm_text(s: str, *, case_sensitive: bool) -> str:
    s = " ".join(s.strip().split()).rstrip(".")
    return s if case_sensitive else s.casefold()


def exact(text: str, expected: Any, *, extract: bool = True, case_sensitive: bool = False) -> float:
    """1.0 when the answer (extracted from `text` unless `extract=False`) equals `expected`."""
    got = extract_answer(text) if extract else text
    if got is None:
        return 0.0
    return float(_norm_text(got, case_sensitive=case_sensitive) == _norm_text(str(expected), case_sensitive=case_sensitive))


def numeric(text: str, expected: Any, *, tol: float = 1e-6) -> float:
    """1.0 when the final answer in `text` is `expected` as a number (absolute/relative tolerance `tol`)."""
    gold = expected if isinstance(expected, (int, float)) and not isinstance(expected, bool) else None
    if gold is None:
        gold = normalize_number(str(expected))
    if gold is None:
        gold = answer_number(str(expected))
    return float(numbers_equal(answer_number(text), gold, tol=tol))


def math_equiv(text: str, expected: Any) -> float:
    """1.0 when math-verify finds the answer in `text` equivalent to `expected` (LaTeX or plain)."""
    from math_verify import parse, verify  # imported here: sympy is slow to import

    # math-verify times out with SIGALRM, which only works in the main thread; the trainer
    # scores candidates in a thread pool, so there it runs without its own timeout.
    main = threading.current_thread() is threading.main_thread()
    parse_kw: dict[str, Any] = {} if main else {"parsing_timeout": None}
    verify_kw: dict[str, Any] = {} if main else {"timeout_seconds": None}
    gold_text = str(expected)
    gold = parse(gold_text, **parse_kw) or parse(f"${gold_text}$", **parse_kw)
    pred = parse(text, **parse_kw)
    if not gold or not pred:
        return 0.0
    return float(bool(verify(gold, pred, **verify_kw)))


def regex(text: str, pattern: str | re.Pattern[str], *, fullmatch: bool = False) -> float:
    """1.0 when `pattern` matches `text` (anywhere, or the whole stripped text with `fullmatch`)."""
    rx = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, re.DOTALL)
    hit = rx.fullmatch(text.strip()) if fullmatch else rx.search(text)
    return float(hit is not None)


def extract_json(text: str) -> Any:
    """The JSON value in `text`: the whole text, a ```json block, or the outermost {...} / [...].

    Raises ValueError when there is none.
    """
    candidates = [text.strip()]
    for block in re.findall(r"```(?:json)?[^\n]*\n(.*?)```", text, re.DOTALL):
        candidates.append(block.strip())
    for open_, close in (("{", "}"), ("[", "]")):
        i, j = text.find(open_), text.rfind(close)
        if i != -1 and j > i:
            candidates.append(text[i : j + 1])
    for c in candidates:
        try:
            return json.loads(c)
        except ValueError:
            continue
    raise ValueError("no valid JSON found")


def json_match(text: str, *, required_keys: Sequence[str] = (), expected: Any = _MISSING) -> float:
    """0.0 without valid JSON; with `expected`: 1.0 if equal; with `required_keys`: the fraction
    present in the JSON object; otherwise 1.0."""
    try:
        value = extract_json(text)
    except ValueError:
        return 0.0
    if expected is not _MISSING:
        if isinstance(expected, str):
            try:
                expected = json.loads(expected)
            except ValueError:
                pass
        return float(value == expected)
    if required_keys:
        if not isinstance(value, dict):
            return 0.0
        return sum(k in value for k in required_keys) / len(required_keys)
    return 1.0


# ---------------------------------------------------------------- unit tests


@dataclass(frozen=True)
class TestReport:
    """The outcome of running test statements against a solution in the sandbox."""

    __test__ = False  # not a pytest class

    passed: int
    total: int
    failures: tuple[str, ...] = ()
    """Failed test statements with the exception they raised, in order."""
    error: str | None = None
    """Why no test could count: unparsable tests, a solution that does not run, a timeout..."""
    sandbox: SandboxResult | None = None

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        return self.total > 0 and self.passed == self.total

    def summary(self, max_failures: int = 3) -> str:
        """A short human (and small-model) readable account."""
        lines = [f"{self.passed}/{self.total} tests passed."]
        if self.error:
            lines.append(self.error)
        for f in self.failures[:max_failures]:
            lines.append(f"FAILED: {f}")
        if len(self.failures) > max_failures:
            lines.append(f"... and {len(self.failures) - max_failures} more failures")
        return "\n".join(lines)


_SETUP_NODES = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def split_tests(tests: str) -> list[tuple[bool, str]]:
    """Top-level statements of `tests` as (is_test, source): asserts and bare calls are tests;
    imports, definitions and assignments are setup. Uncalled `def test_*()` functions are called.

    Raises SyntaxError when the tests do not parse.
    """
    try:
        tree = ast.parse(tests)
    except (ValueError, RecursionError, MemoryError) as exc:
        raise SyntaxError(str(exc)) from exc
    items: list[tuple[bool, str]] = []
    defined: list[str] = []
    called: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            defined.append(node.name)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name):
                called.add(sub.func.id)
        is_test = not isinstance(node, _SETUP_NODES) and (
            any(isinstance(sub, ast.Assert) for sub in ast.walk(node))
            or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call))
        )
        items.append((is_test, ast.unparse(node)))
    items += [(True, f"{name}()") for name in defined if name not in called]
    return items


_HARNESS = """\
import sys


def _run(nonce, solution, items):
    out = sys.stdout
    quiet = open("/dev/null", "w")
    env = {"__name__": "solution"}
    sys.stdout = quiet
    try:
        exec(compile(solution, "solution.py", "exec"), env)
    except BaseException as exc:
        out.write(f"{nonce} solution {type(exc).__name__}: {str(exc)[:200]!r}\\n")
    for index, (is_test, source) in enumerate(items):
        sys.stdout = quiet
        try:
            exec(compile(source, "tests.py", "exec"), env)
            verdict = "ok"
        except BaseException as exc:
            verdict = type(exc).__name__
        if is_test:
            out.write(f"{nonce} test {index} {verdict}\\n")
            out.flush()


_run(sys.stdin.readline().strip(), SOLUTION, ITEMS)
"""


def run_unit_tests(code: str, tests: str, *, timeout_s: float = 3.0) -> TestReport:
    """Run `code`, then each statement of `tests`, in one sandboxed process; count passing tests.

    The harness reports each verdict with a random nonce it reads from stdin, so the solution's
    own prints cannot pass for verdicts (a program that inspects the harness's frames could still
    find it; the sandbox keeps such a program from doing harm, not from cheating).
    """
    try:
        items = split_tests(tests)
    except SyntaxError as exc:
        return TestReport(0, 0, error=f"the tests do not parse: {exc}")
    total = sum(1 for is_test, _ in items if is_test)
    if total == 0:
        return TestReport(0, 0, error="no test statements (write assert statements)")
    nonce = secrets.token_hex(16)
    program = _HARNESS.replace("SOLUTION, ITEMS", f"{code!r}, {items!r}")
    result = run_python(program, timeout_s=timeout_s, stdin=nonce + "\n")
    verdicts: dict[int, str] = {}
    solution_error: str | None = None
    for line in result.stdout.splitlines():
        parts = line.split(" ", 3)
        if parts[0] != nonce or len(parts) < 3:
            continue
        if parts[1] == "test" and len(parts) == 4 and parts[2].isdigit():
            verdicts[int(parts[2])] = parts[3]
        elif parts[1] == "solution":
            solution_error = " ".join(parts[2:])
    passed = sum(1 for v in verdicts.values() if v == "ok")
    failures = []
    for index, (is_test, source) in enumerate(items):
        if is_test and verdicts.get(index, "ok") != "ok":
            failures.append(f"{source.splitlines()[0][:160]}  ({verdicts[index]})")
    error = None
    if solution_error:
        error = f"the code raised {solution_error}"
    if result.error is not None:
        error = f"stopped: {result.error} after {len(verdicts)} of {total} tests"
    elif result.exit_code != 0 and not verdicts:
        error = "the tests could not run: " + (result.stderr.strip().splitlines() or ["unknown error"])[-1]
    return TestReport(passed, total, tuple(failures), error, result)


def unit_tests(text: str, tests: str, *, timeout_s: float = 3.0) -> float:
    """The fraction of `tests` that pass against the code in `text` (its last code block, or all of it)."""
    code = extract_code(text) or text
    return run_unit_tests(code, tests, timeout_s=timeout_s).fraction


# ---------------------------------------------------------------- TRL-style reward functions


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, a chat message, or a list of chat messages (TRL's
    conversational format, `[{"role": "assistant", "content": "..."}]`; the assistant's last)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content", ""))
    if isinstance(completion, (list, tuple)):
        messages = [m for m in completion if isinstance(m, dict)]
        assistant = [m for m in messages if m.get("role") == "assistant"] or messages
        return _content_text(assistant[-1].get("content", "")) if assistant else ""
    return str(completion)


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # multimodal content parts
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _column(columns: dict[str, Any], name: str, n: int, fn_name: str) -> list[Any]:
    if name not in columns:
        have = ", ".join(sorted(columns)) or "none"
        raise KeyError(f"reward function {fn_name} needs the dataset column {name!r}; the rows have: {have}")
    values = columns[name]
    if isinstance(values, (list, tuple)):
        if len(values) != n:
            raise ValueError(f"column {name!r} has {len(values)} values for {n} completions")
        return list(values)
    return [values] * n


def _reward_fn(name: str, score: Callable[[str, dict[str, Any]], float], columns_needed: Sequence[str]) -> RewardFn:
    def fn(prompts: Sequence[Any] | None = None, completions: Sequence[Any] = (), **columns: Any) -> list[float]:
        n = len(completions)
        cols = {c: _column(columns, c, n, name) for c in columns_needed}
        return [score(completion_text(comp), {c: cols[c][i] for c in cols}) for i, comp in enumerate(completions)]

    fn.__name__ = fn.__qualname__ = name
    return fn


def exact_reward(*, column: str = "answer", extract: bool = True, case_sensitive: bool = False) -> RewardFn:
    """Reward 1.0 when the completion's answer equals the row's `column`."""
    return _reward_fn(
        "exact_reward",
        lambda text, row: exact(text, row[column], extract=extract, case_sensitive=case_sensitive),
        [column],
    )


def numeric_reward(*, tol: float = 1e-6, column: str = "answer") -> RewardFn:
    """Reward 1.0 when the completion's final number equals the row's `column` within `tol`."""
    return _reward_fn("numeric_reward", lambda text, row: numeric(text, row[column], tol=tol), [column])


def math_equiv_reward(*, column: str = "answer") -> RewardFn:
    """Reward 1.0 when math-verify finds the completion equivalent to the row's `column`."""
    return _reward_fn("math_equiv_reward", lambda text, row: math_equiv(text, row[column]), [column])


def regex_reward(pattern: str | None = None, *, column: str = "pattern", fullmatch: bool = False) -> RewardFn:
    """Reward 1.0 when `pattern` (or, when None, the row's `column`) matches the completion."""
    if pattern is not None:
        rx = re.compile(pattern, re.DOTALL)  # a bad pattern fails here, not mid-run
        return _reward_fn("regex_reward", lambda text, row: regex(text, rx, fullmatch=fullmatch), [])
    return _reward_fn("regex_reward", lambda text, row: regex(text, str(row[column]), fullmatch=fullmatch), [column])


def json_reward(*, required_keys: Sequence[str] = (), column: str | None = None) -> RewardFn:
    """Reward for valid JSON; equal to the row's `column` when given; else the fraction of `required_keys`."""
    keys = tuple(required_keys)
    if column is None:
        return _reward_fn("json_reward", lambda text, row: json_match(text, required_keys=keys), [])
    return _reward_fn("json_reward", lambda text, row: json_match(text, expected=row[column]), [column])


def unit_tests_reward(*, column: str = "tests", timeout_s: float = 3.0) -> RewardFn:
    """Reward = the fraction of the row's `column` tests that the completion's code passes."""
    return _reward_fn("unit_tests_reward", lambda text, row: unit_tests(text, str(row[column]), timeout_s=timeout_s), [column])


exact_answer = exact_reward()
numeric_answer = numeric_reward()
math_answer = math_equiv_reward()
json_valid = json_reward()
unit_tests_passed = unit_tests_reward()


BUILTIN_REWARDS: dict[str, RewardFn] = {
    f"agents.verifiers:{name}": fn
    for name, fn in (("exact_answer", exact_answer), ("numeric_answer", numeric_answer), ("math_answer", math_answer),
                     ("json_valid", json_valid), ("unit_tests_passed", unit_tests_passed))
}
"""The ready-made reward functions a config may always name."""


def load_reward_fn(path: str) -> RewardFn:
    """A TRL-style reward function named `pkg.module:function`: a built-in or a registered plugin.

    Raises PluginError when it is neither, the object is not callable, or it cannot take
    `prompts=` and `completions=` keyword arguments.
    """
    if path in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[path]
    obj = lookup(path, kind=REWARD_FUNCTION)
    if not callable(obj):
        raise PluginError(f"reward function {path!r} is a {type(obj).__name__}, not a callable")
    fn: RewardFn = obj
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return fn  # a builtin or C callable: trust it
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    var_kw = any(p.kind == p.VAR_KEYWORD for p in params)
    missing = [n for n in ("prompts", "completions") if n not in names and not var_kw]
    if missing:
        raise PluginError(
            f"reward function {path!r} must accept (prompts, completions, **columns); it does not take {', '.join(missing)}"
        )
    return fn
