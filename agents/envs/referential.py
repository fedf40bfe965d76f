"""`referential`: a speaker sees a target, a listener picks it from shuffled candidates by the
speaker's one-word message.

Split information: the `speaker` sees only the target (one of the `pool` objects); the `listener`
sees the task's `k` candidates, shuffled per task and labelled A, B, C, ..., and the speaker's
message, never the target. The message must be exactly one word of a small code vocabulary that
says nothing about the objects (by default the digits 1 to `pool`), so only a protocol both agents
have learned (this target -> that code -> that candidate) does better than chance, 1/k.

Parsing is strict where information could pass. The speaker's message is the one code word its
first line holds as a word of its own ("3", "Code: 3", "The code is 3."; case-insensitive); a line
with none, or with two different ones, is no message, and the listener is told so. The listener is
shown that code word alone, never the speaker's text, so nothing but the code passes (a speaker
that writes "yellow, code 3" sends "3"). The listener's action is valid when its first line is one
candidate letter, optionally after "Answer:", in brackets or followed by that candidate's own name
("B", "Answer: B", "(B)", "B. yellow"), or one candidate's name alone ("yellow"); a letter with
another candidate's name is no answer.

Rewards: team reward 1.0 when the listener picks the target, else 0.0 (both agents share it);
local reward -1 for an action that does not parse, else 0. The episode ends after the listener's
turn (or the speaker's, when the team has no listener: the speaker alone then names a letter at
random, so a lone speaker is at chance by construction). Use `grpo.sampling: independent`: the
speaker's reward is then the team's reward at the end of its trajectory (under tree sampling a
speaker's candidates are scored before the listener acts and see no team reward).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from agents.base import Message, RowField, State, StepResult, required_of
from agents.envs._common import advance, check_roles, check_turn

OBJECTS: tuple[str, ...] = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink")
"""The targets' pool (the first `pool` of them), one short word each."""
LETTERS = "ABCDEFGHI"
MAX_K = len(LETTERS)
_FIRST_LINE = re.compile(r"^[^\n]*")
_STRIP = " \t\"'`*"
NO_MESSAGE = "(no message: the speaker did not send one code word)"


def clean_first_line(text: str) -> str:
    """The action's first non-empty line, less surrounding spaces, quotes, asterisks and one final
    full stop (`' "3". '` -> `3`)."""
    for line in str(text).splitlines():
        line = line.strip(_STRIP)
        if line:
            line = line[:-1] if line.endswith(".") else line
            return line.strip(_STRIP)
    return ""


def parse_code(text: str, codes: tuple[str, ...]) -> str | None:
    """The code word the speaker sent (in `codes`' spelling): the one code word its first line
    holds as a word of its own; None when it holds none or two different ones."""
    words = re.findall(r"[A-Za-z0-9]+", clean_first_line(text).lower())
    found = {code for code in codes if code.lower() in words}
    return found.pop() if len(found) == 1 else None


def parse_choice(text: str, k: int, candidates: tuple[str, ...] | list[str] | None = None) -> int | None:
    """The index (0-based) of the candidate the listener picked: its first line is one letter of
    the first `k`, optionally after `Answer:`, in brackets, or followed by `.`, `)` or `:` and that
    candidate's name, or (when `candidates` are given) one candidate's name alone; None otherwise."""
    line = clean_first_line(text)
    line = re.sub(r"^answer\s*:\s*", "", line, flags=re.IGNORECASE).strip(_STRIP)
    if candidates is not None and len(line) > 1:
        names = [c.lower() for c in candidates[:k]]
        if line.lower() in names:
            return names.index(line.lower())
    m = re.fullmatch(r"\(?([A-Za-z])\)?(?:\s*[.):]\s*(.*))?", line)
    if m is None or m.group(1).upper() not in LETTERS[:k]:
        return None
    index = LETTERS.index(m.group(1).upper())
    named = (m.group(2) or "").strip(_STRIP + ".")
    if named and (candidates is None or named.lower() != candidates[index].lower()):
        return None
    return index


class Referential:
    """Referential game: a speaker codes the target in one word, a listener picks it from candidates."""

    name = "referential"
    roles: tuple[str, ...] = ("speaker", "listener")
    solo_roles: tuple[str, ...] = ()
    """Neither role can succeed alone: the speaker never sees the candidates, the listener never
    sees the target (the `alone` ablation is refused)."""
    row_fields: dict[str, RowField] = {
        "target": RowField("text", max_length=40, help="the object the speaker sees; one of the candidates"),
        "candidates": RowField("text_list", max_length=40,
                               help="the objects the listener sees, in the order shown (A, B, ...); 2 to 9, distinct"),
        "question": RowField("text", required=False, help="not shown to the agents (kept as metadata)"),
    }
    """What a dataset row holds (checked on upload; see `agents.base.RowField`)."""
    required_fields: tuple[str, ...] = required_of(row_fields)
    default_instructions: dict[str, str] = {  # short: the prompt is most of a step's cost
        "speaker": "Speaker: reply with one code word for the target.",
        "listener": "Listener: reply with the candidate the code word means.",
    }
    stop_patterns: dict[str, str] = {"speaker": r"\S[^\n]*\n", "listener": r"\S[^\n]*\n"}
    """End an action at the end of its first non-empty line (only that line is read)."""

    def __init__(self, k: int = 4, pool: int | None = None, codes: list[str] | None = None) -> None:
        """`k`: candidates per task (2 to 9; chance is 1/k). `pool`: how many objects targets and
        candidates are drawn from (k to 9; default k, so every task shows the same objects, shuffled).
        `codes`: the code vocabulary (default the digits 1 to `pool`): at least `pool` distinct words
        of letters or digits, none of them an object's name."""
        if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= MAX_K:
            raise ValueError(f"referential: k must be a whole number from 2 to {MAX_K}, not {k!r}")
        pool = k if pool is None else pool
        if isinstance(pool, bool) or not isinstance(pool, int) or not k <= pool <= len(OBJECTS):
            raise ValueError(f"referential: pool must be a whole number from k ({k}) to {len(OBJECTS)}, not {pool!r}")
        if codes is None:
            codes = [str(i + 1) for i in range(pool)]
        if not isinstance(codes, (list, tuple)) or not all(isinstance(c, str) and re.fullmatch(r"[A-Za-z0-9]{1,12}", c) for c in codes):
            raise ValueError("referential: codes must be a list of words of 1 to 12 letters or digits")
        lowered = [c.lower() for c in codes]
        if len(set(lowered)) != len(codes) or len(codes) < pool:
            raise ValueError(f"referential: codes must hold at least pool ({pool}) distinct words, got {list(codes)!r}")
        clash = sorted(set(lowered) & set(OBJECTS))
        if clash:
            raise ValueError(f"referential: a code word may not name an object: {', '.join(clash)}")
        self.k, self.pool, self.codes = k, pool, tuple(codes)

    @property
    def chance(self) -> float:
        """The success of a listener that ignores the message: 1/k."""
        return 1.0 / self.k

    # ------------------------------------------------------------ tasks

    def generate(self, n: int, *, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        objects = OBJECTS[: self.pool]
        rows = []
        for _ in range(n):
            candidates = rng.sample(objects, self.k)  # a uniformly random order: the target's letter is uniform
            target = rng.choice(candidates)
            rows.append({"target": target, "candidates": candidates, "question": f"target: {target}"})
        return rows

    # ------------------------------------------------------------ episode

    def reset(self, row: dict[str, Any], *, task_id: str, roles: tuple[str, ...]) -> State:
        roles = check_roles(self.name, self.roles, roles)
        target, candidates = str(row["target"]).strip(), row["candidates"]
        if not isinstance(candidates, (list, tuple)) or not all(isinstance(c, str) for c in candidates):
            raise ValueError(f"referential: task {task_id}: candidates must be a list of text")
        candidates = [c.strip() for c in candidates]
        if len(candidates) != self.k:
            raise ValueError(f"referential: task {task_id} has {len(candidates)} candidates; this game shows k={self.k}")
        if len({c.lower() for c in candidates}) != len(candidates):
            raise ValueError(f"referential: task {task_id}: the candidates must be distinct")
        lowered = [c.lower() for c in candidates]
        if target.lower() not in lowered:
            raise ValueError(f"referential: task {task_id}: the target {target!r} is not among the candidates")
        return State(task_id=task_id, row=dict(row), data={
            "roles": roles, "target": target, "candidates": tuple(candidates), "answer": lowered.index(target.lower()),
            "code": None, "choice": None,
        })

    def observe(self, state: State, role: str) -> str:
        codes = " ".join(self.codes)
        if role == "speaker":
            return f"Target: {state.data['target']}\nCode words: {codes}"
        shown = ", ".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(state.data["candidates"]))
        said = state.data["code"]
        if "speaker" not in state.data["roles"]:
            message = "(there is no speaker)"
        elif said is None:
            message = NO_MESSAGE
        else:
            message = said
        return f"Candidates: {shown}\nSpeaker's message: {message}"

    def step(self, state: State, *, agent: str, role: str, action: str) -> StepResult:
        check_turn(self.name, self.roles, state, role)
        roles: tuple[str, ...] = state.data["roles"]
        if role == "speaker":
            code = parse_code(action, self.codes)
            done = "listener" not in roles
            success = done and _lone_guess(state.task_id, self.k) == state.data["answer"]
            next_state = advance(state, Message(agent, role, action), done=done, success=success, code=code)
            info: dict[str, Any] = {"code": code, "valid": code is not None, "target": state.data["target"]}
            return StepResult(next_state, local_reward=0.0 if code is not None else -1.0,
                              team_reward=1.0 if success else 0.0, info=info)
        choice = parse_choice(action, self.k, state.data["candidates"])
        success = choice is not None and choice == state.data["answer"]
        next_state = advance(state, Message(agent, role, action), done=True, success=success, choice=choice)
        info = {"choice": None if choice is None else LETTERS[choice], "valid": choice is not None,
                "correct": success, "message": state.data["code"]}
        return StepResult(next_state, local_reward=0.0 if choice is not None else -1.0,
                          team_reward=1.0 if success else 0.0, info=info)


def _lone_guess(task_id: str, k: int) -> int:
    """The letter a team without a listener picks: fixed per task, independent of everything the
    speaker did (a seeded draw from the task id), so `step` stays pure."""
    return random.Random(f"referential:{task_id}").randrange(k)


def format_demos(env: Referential, n: int, *, seed: int, lean: float | Sequence[float] | None = None) -> list[dict[str, Any]]:
    """`n` conversations per role that teach the actions' form and nothing else (a format warm
    start, docs/benchmarks.md "Referential game"): the speaker sends a code word drawn uniformly,
    whatever the target; the listener names a candidate drawn uniformly, whatever the message. A
    team that learned only these is at chance by construction, with every code and every
    candidate equally likely, so RL starts from varied, valid actions. TRL's conversational format,
    one line per agent turn (`training.conversations`).

    `lean`: the probability that the speaker sends the target's own code word (the i-th code for
    the i-th object), another one uniformly otherwise; one number for every target, or one per
    object of the pool in order (red, blue, ...). It breaks the symmetry a protocol has to start
    from. The listener's picks stay uniform whatever the message, so the team it leaves is still
    at chance. (`configs/referential-lean.yaml` uses 1.0, stopped early; a lean per object such as
    1.0 for red and 0.8 for blue makes code 1 the likelier one for both targets, so a greedy
    speaker sends no code: docs/benchmarks.md, "Referential game".)"""
    if lean is not None:
        leans = [float(lean)] * env.pool if isinstance(lean, (int, float)) else [float(x) for x in lean]
        if len(leans) != env.pool or not all(0.0 <= x <= 1.0 for x in leans):
            raise ValueError(f"referential demos: lean must be one probability or {env.pool} (one per object), each from 0 to 1, not {lean!r}")
    rng = random.Random(seed)
    rows = env.generate(n, seed=seed)
    out: list[dict[str, Any]] = []
    for i, row in enumerate(rows):
        state = env.reset(row, task_id=f"demo-{i}", roles=env.roles)
        if lean is None:
            code = rng.choice(env.codes)
        else:
            index = OBJECTS.index(state.data["target"].lower())
            own = env.codes[index]
            others = [c for c in env.codes[: env.pool] if c != own]
            code = own if rng.random() < leans[index] else rng.choice(others)
        spoken = env.step(state, agent="speaker", role="speaker", action=code).state
        for role, seen, action in (("speaker", state, code),
                                   ("listener", spoken, rng.choice(spoken.data["candidates"]))):
            out.append({"agent": role, "messages": [
                {"role": "system", "content": env.default_instructions[role]},
                {"role": "user", "content": env.observe(seen, role)},
                {"role": "assistant", "content": action},
            ]})
    return out


if __name__ == "__main__":  # python -m agents.envs.referential demos OUT.jsonl [N] [K] [LEAN]
    import json
    import sys

    if len(sys.argv) < 3 or sys.argv[1] != "demos":
        sys.exit("usage: python -m agents.envs.referential demos OUT.jsonl [N per role, 512] [k, 4] [speaker's lean: p, or p1,p2,... per object]")
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    game = Referential(k=int(sys.argv[4]) if len(sys.argv) > 4 else 4)
    try:
        leans = [float(x) for x in sys.argv[5].split(",")] if len(sys.argv) > 5 else []  # 0.8, or 1.0,0.8 per object
        lean = None if not leans else leans[0] if len(leans) == 1 else leans
        demos = format_demos(game, n, seed=7, lean=lean)
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        for conversation in demos:
            f.write(json.dumps(conversation) + "\n")
