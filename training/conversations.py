"""Conversations for supervised fine-tuning: read, check and give each to the agent it trains.

A conversations file is JSONL, one conversation per line, in TRL's conversational format:

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "..."}, {"role": "tool", "content": "..."}, ...],
     "agent": "solver"}

`role` is one of system, user, assistant, tool; `content` is text (an assistant message that only
calls tools may give `tool_calls` instead). `agent` is optional: it names the topology's agent
whose assistant turns these are, by its name or by its role; with one acting agent it may be left
out. A multi-agent conversation is one line per agent, each from that agent's side.

A line may instead hold a prompt and its completion (TRL's prompt-completion format), which is how a
run's own episodes become examples (`webapp.runs.warmstart`): the prompt is the text the agent was
given, already rendered with its chat template, and the completion what it wrote, as text or as
the assistant and tool messages of a turn that called tools:

    {"prompt": "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n", "completion": "4", "agent": "solver"}
    {"prompt": "...", "completion": [{"role": "assistant", "content": "<tool_call>...</tool_call>"},
                                     {"role": "tool", "name": "calculator", "content": "4"},
                                     {"role": "assistant", "content": "The answer is 4."}], "agent": "solver"}

Only the completion's assistant text (and the end of turn after it) is learned; the prompt and the
tool results are context (`training.sft.encode_completion`).

`read_conversations` checks the whole file and raises every bad line at once (a `DataErrors`
with line numbers), as `training.data.read_rows` does for task rows, so the web's upload check
and the engine read a file the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.config import RunConfig
from training.data import MAX_FIELD_CHARS, MAX_PROBLEMS, DataError, DataErrors, _decode, _jsonl_rows, _read_bytes
from training.text import unstorable_strings

ROLES = ("system", "user", "assistant", "tool")
MAX_MESSAGES = 256
"""Most messages in one conversation."""
ROW_KEYS = ("messages", "prompt", "completion", "agent", "tools")
"""What a line may hold: `messages`, or `prompt` and `completion`; `tools` (TRL's tool schemas) is
accepted and left to the agent's config."""


@dataclass(frozen=True)
class Conversation:
    line: int
    """1-based line of the file it came from (0 when built in memory)."""
    messages: tuple[dict[str, Any], ...]
    """The conversation; for a prompt-completion line, the completion's messages (assistant and tool)."""
    agent: str | None = None
    """The agent (name or role) the row names; None when it names none."""
    prompt: str | None = None
    """A prompt-completion line's prompt, as the agent's chat template rendered it; None for `messages`."""

    def assistant_turns(self) -> int:
        return sum(m["role"] == "assistant" for m in self.messages)


def check_conversation(row: Any, line: int) -> Conversation:
    """One line's conversation; a DataError naming the line and what is wrong (all of it)."""
    if not isinstance(row, dict):
        raise DataError("each line must be a JSON object with `messages` (or `prompt` and `completion`)", line)
    problems = [f"unknown field {key!r} (allowed: {', '.join(ROW_KEYS)})" for key in row if key not in ROW_KEYS]
    # text no database can store, anywhere in the line: the web's check (trust.check_tree), word for word
    problems += [f"`{where}` {problem}" for where, problem in unstorable_strings(row)]
    agent = row.get("agent")
    if agent is not None and (not isinstance(agent, str) or not agent.strip()):
        problems.append("`agent` must be an agent's name or role")
    prompt: str | None = None
    if "prompt" in row or "completion" in row:
        prompt, messages = _prompt_completion(row, problems)
        where = "completion"
    else:
        messages, where = row.get("messages"), "messages"
        if "messages" not in row:
            problems.append("`messages` is missing: each line is {\"messages\": [{role, content}, ...]} (or `prompt` and `completion`)")
            messages = None
        elif messages == []:
            problems.append("`messages` is empty: nothing to learn from")
            messages = None
    if messages is None:  # said above
        messages = []
    elif not isinstance(messages, list) or not messages:
        problems.append(f"`{where}` must be a non-empty list of {{role, content}} objects")
        messages = []
    elif len(messages) > MAX_MESSAGES:
        problems.append(f"{len(messages)} messages; at most {MAX_MESSAGES}")
        messages = []
    clean: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        at = f"{where}[{i}]"
        if not isinstance(m, dict):
            problems.append(f"{at} must be an object with `role` and `content`")
            continue
        role, content, calls = m.get("role"), m.get("content"), m.get("tool_calls")
        allowed = ROLES if prompt is None else ("assistant", "tool")
        if role not in allowed:
            problems.append(f"{at}.role is {role!r}; allowed: {', '.join(allowed)}")
            continue
        if calls is not None and (role != "assistant" or not isinstance(calls, list)):
            problems.append(f"{at}.tool_calls: only an assistant message may call tools, as a list")
            continue
        if content is None and calls:
            content = ""
        if not isinstance(content, str):
            problems.append(f"{at}.content must be text")
            continue
        if len(content) > MAX_FIELD_CHARS:
            problems.append(f"{at}.content has {len(content):,} characters; at most {MAX_FIELD_CHARS:,}")
            continue
        message: dict[str, Any] = {"role": role, "content": content}
        if calls:
            message["tool_calls"] = calls
        if role == "tool" and isinstance(m.get("name"), str):
            message["name"] = m["name"]
        clean.append(message)
    if messages and not problems and not any(m["role"] == "assistant" for m in clean):
        problems.append("no assistant message: nothing to learn from")
    if problems:
        raise DataError("; ".join(problems), line)
    return Conversation(line, tuple(clean), agent.strip() if isinstance(agent, str) else None, prompt)


def _prompt_completion(row: dict[str, Any], problems: list[str]) -> tuple[str | None, Any]:
    """A prompt-completion line's prompt and its completion as messages (a text completion is one
    assistant message); each problem added to `problems` (None for a completion already said wrong)."""
    prompt, completion = row.get("prompt"), row.get("completion")
    if "messages" in row:
        problems.append("a line holds `messages` or `prompt` and `completion`, not both")
    if "prompt" not in row:
        problems.append("`prompt` is missing: the text the agent was given")
        prompt = ""
    elif not isinstance(prompt, str):
        problems.append("`prompt` must be text: the text the agent was given")
        prompt = ""
    elif not prompt:
        problems.append("`prompt` is empty: give the text the agent was given")
    elif len(prompt) > MAX_FIELD_CHARS:
        problems.append(f"`prompt` has {len(prompt):,} characters; at most {MAX_FIELD_CHARS:,}")
    elif "\x00" in prompt:
        problems.append("`prompt` holds a NUL character")
    if isinstance(completion, str):
        if not completion:
            problems.append("`completion` is empty: nothing to learn from")
        return prompt, [{"role": "assistant", "content": completion}]
    if "completion" not in row:
        problems.append("`completion` is missing: the agent's answer, as text or as a list of {role, content} messages")
        return prompt, None
    if completion == []:
        problems.append("`completion` is empty: nothing to learn from")
        return prompt, None
    if not isinstance(completion, list):
        problems.append("`completion` must be text or a non-empty list of {role, content} messages")
        return prompt, None
    return prompt, completion


def read_conversations(path: str | Path, *, max_rows: int | None = None, max_bytes: int | None = None) -> list[Conversation]:
    """Every conversation of a JSONL file, each line checked; raises every bad line found (up to
    `training.data.MAX_PROBLEMS`) as one `DataErrors`, or the one `DataError`."""
    text = _decode(_read_bytes(Path(path), max_bytes))
    out: list[Conversation] = []
    problems: list[DataError] = []
    for number, row in _jsonl_rows(text):
        try:
            if isinstance(row, DataError):
                raise row
            out.append(check_conversation(row, number))
        except DataError as exc:
            problems.append(exc)
            if len(problems) >= MAX_PROBLEMS:
                raise DataErrors(problems, stopped=True) from None
        if max_rows is not None and len(out) + len(problems) > max_rows:
            raise DataError(f"more than {max_rows:,} conversations")
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise DataErrors(problems)
    if not out:
        raise DataError("no conversations")
    return out


def by_agent(conversations: Sequence[Conversation], config: RunConfig) -> dict[str, list[Conversation]]:
    """The conversations each acting agent of `config` learns from, in file order.

    A conversation goes to the agent its `agent` names (an agent's name first, else the one acting
    agent with that role); one without `agent` goes to the only acting agent. Every line that fits
    no agent is reported at once."""
    acting = list(dict.fromkeys(config.topology.order()))
    roles: dict[str, list[str]] = {}
    for name in acting:
        roles.setdefault(config.agent(name).role, []).append(name)
    out: dict[str, list[Conversation]] = {name: [] for name in acting}
    problems: list[DataError] = []
    for conv in conversations:
        if conv.agent is None:
            if len(acting) == 1:
                out[acting[0]].append(conv)
            else:
                problems.append(DataError(f"no `agent`: name the agent whose turns these are (one of {', '.join(acting)})", conv.line or None))
        elif conv.agent in out:
            out[conv.agent].append(conv)
        elif len(roles.get(conv.agent, [])) == 1:
            out[roles[conv.agent][0]].append(conv)
        else:
            why = "several agents play that role" if conv.agent in roles else "no acting agent has that name or role"
            problems.append(DataError(f"`agent` {conv.agent!r}: {why}; agents: {', '.join(acting)}", conv.line or None))
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise DataErrors(problems[:MAX_PROBLEMS], stopped=len(problems) > MAX_PROBLEMS)
    return out


# == a run's own episodes as examples =============================================================


@dataclass
class EpisodeRows:
    """An episode's turns as prompt-completion rows (`episode_rows`)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    truncated: int = 0
    """Chosen candidates left out because they hit the length cap (`truncated`): a row of one would
    teach the agent to end its turn where the cap cut it, as `grpo.mask_truncated` keeps them out
    of GRPO's loss."""


def episode_rows(data: Any) -> EpisodeRows:
    """Each turn's chosen candidate of a stored episode (`training.rollout.Episode.to_dict`) as a
    prompt-completion row for the agent that wrote it (none for a turn without text, none for a
    candidate cut off at the length cap): the turn's prompt, and the candidate's text, or its
    segments with each tool call's result between them."""
    out = EpisodeRows()
    for turn in data.get("turns", []) if isinstance(data, dict) else []:
        candidates, chosen = turn.get("candidates") or [], turn.get("chosen", 0)
        if not (isinstance(chosen, int) and 0 <= chosen < len(candidates)) or not turn.get("prompt") or not turn.get("agent"):
            continue
        candidate = candidates[chosen]
        completion = completion_of(candidate)
        if completion and candidate.get("truncated"):
            out.truncated += 1
        elif completion:
            out.rows.append({"agent": turn["agent"], "prompt": turn["prompt"], "completion": completion})
    return out


def completion_of(candidate: dict[str, Any]) -> str | list[dict[str, str]]:
    """The candidate's own text; for a turn that called tools, its segments with each call's result
    between them (call i came after segment i)."""
    calls, segments = candidate.get("calls") or [], candidate.get("segments") or []
    if not calls or not segments:
        return str(candidate.get("text") or "")
    messages: list[dict[str, str]] = []
    for i, segment in enumerate(segments):
        messages.append({"role": "assistant", "content": str(segment)})
        if i < len(calls):
            call = calls[i]
            result = f"Error: {call['error']}" if call.get("error") else str(call.get("result", ""))  # agents.tools.result_text
            messages.append({"role": "tool", "name": str(call.get("name") or "tool"), "content": result})
    return messages
