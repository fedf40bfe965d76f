"""A turn in which the agent may call tools: generate, run the call, append its result, generate on.

The model's completion and the tool results form one token sequence after the prompt:

    [prompt] [model: ... <tool_call>{...}</tool_call>] [result, as the chat template frames it] [model: ...] ...

`mask` marks the model's own tokens (1) and the spliced results (0): the loss is computed on the
model's tokens only, while the results stay in the context the model saw. At most
`generation.max_tool_calls` calls run per turn; the candidate's action for the environment is
the model's text of every segment.

Chat templates: one that renders `tools=` (Hermes, Qwen, SmolLM3, Llama 3.1 ...) gets the tool
schemas and `tool` messages the way the model was trained on them. One that does not (SmolLM2's
ChatML, for instance: `tool_support` says which) gets the tools described in the system prompt
in the same `<tool_call>` format, and each result as a user message; Troupe says so when a
topology gives such a model tools.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.tools import CALL_END, Tool, ToolCall, parse_call, result_text, run_call
from training.generation import Generation

Messages = list[dict[str, Any]]
_PROBE = Tool("troupe_probe_tool", "Probe whether a chat template renders tools.",
              {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}, lambda x: x)


def tool_support(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders the `tools=` it is given (tried once per
    tokenizer and template: a template set afterwards is tried again)."""
    template = getattr(tokenizer, "chat_template", None)
    cached = getattr(tokenizer, "_troupe_tool_support", None)
    if cached is not None and cached[0] == template:
        return bool(cached[1])
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[_PROBE.schema()], tokenize=False,
                                             add_generation_prompt=True)
        supported = isinstance(text, str) and _PROBE.name in text
    except Exception:  # a template that cannot take tools may raise anything jinja raises
        supported = False
    try:
        tokenizer._troupe_tool_support = (template, supported)
    except AttributeError:
        pass
    return supported


def describe_tools(tools: Sequence[Tool]) -> str:
    """The tool list and the call format, for a system prompt (templates without tool support)."""
    lines = [f"- {t.signature()}: {t.description}" for t in tools]
    first = tools[0]
    example_args = dict(first.example) if first.example else {k: "..." for k in first.parameters.get("properties", {})}
    example = json.dumps({"name": first.name, "arguments": example_args})
    return (
        "You can call these tools:\n" + "\n".join(lines) + "\n"
        f"To call one, write a line like\n<tool_call>{example}</tool_call>\nand stop. The result comes back in "
        "the next message; then go on."
    )


def messages_with_tools(messages: Messages, tools: Sequence[Tool], *, supported: bool) -> Messages:
    """The turn's messages as the template gets them: unchanged when it renders `tools=`, else with
    the tools described at the end of the system prompt (one is added when there is none) and a
    worked exchange with the first tool that has a `demo` before the task (small models follow a
    shown call far more often than a described one)."""
    if supported or not tools:
        return messages
    text = describe_tools(tools)
    if messages and messages[0]["role"] == "system":
        head, rest = [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}], messages[1:]
    else:
        head, rest = [{"role": "system", "content": text}], messages
    return [*head, *demonstration(tools), *rest]


def demonstration(tools: Sequence[Tool]) -> Messages:
    """A question, the call, its real result and the answer, for the first tool with a `demo`."""
    tool = next((t for t in tools if t.demo and t.example), None)
    if tool is None or tool.demo is None or tool.example is None:
        return []
    call = run_call(ToolCall(tool.name, dict(tool.example)), {tool.name: tool})
    question, answer = tool.demo
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": f"<tool_call>{json.dumps({'name': tool.name, 'arguments': dict(tool.example)})}</tool_call>"},
        result_message(call, supported=False),
        {"role": "assistant", "content": answer.format(result=result_text(call))},
    ]


def render(tokenizer: Any, messages: Messages, tools: Sequence[Tool], *, supported: bool, generation_prompt: bool) -> str:
    schemas = [t.schema() for t in tools] if supported and tools else None
    text = tokenizer.apply_chat_template(messages, tools=schemas, tokenize=False, add_generation_prompt=generation_prompt)
    assert isinstance(text, str)
    return text


def result_message(call: ToolCall, *, supported: bool) -> dict[str, Any]:
    if supported:
        return {"role": "tool", "name": call.name or "tool", "content": result_text(call)}
    return {"role": "user", "content": f"Result of {call.name or 'the tool call'}: {result_text(call)}"}


def result_ids(tokenizer: Any, messages: Messages, tools: Sequence[Tool], segment: Generation, call: ToolCall,
               *, supported: bool, end_ids: Sequence[int]) -> tuple[int, ...]:
    """The tokens that follow the model's segment: the template's close of the assistant message,
    the result message and the next assistant header. They are the difference between the
    conversation rendered with the result (and a generation prompt) and rendered up to the end of
    the model's text; an end-of-turn token the model already wrote is not repeated."""
    assistant = {"role": "assistant", "content": segment.text}
    before = render(tokenizer, [*messages, assistant], tools, supported=supported, generation_prompt=False)
    after = render(tokenizer, [*messages, assistant, result_message(call, supported=supported)], tools,
                   supported=supported, generation_prompt=True)
    cut = before.rfind(segment.text) + len(segment.text) if segment.text else len(before) - len(before.lstrip())
    if after[:cut] != before[:cut]:  # a template that renders the earlier messages differently once a result follows
        cut = _common_prefix(before, after)
    delta = after[cut:]
    if segment.token_ids and segment.token_ids[-1] in end_ids:
        ended = tokenizer.decode([segment.token_ids[-1]], skip_special_tokens=False)
        if delta.startswith(ended):
            delta = delta[len(ended):]
    return tuple(tokenizer(delta, add_special_tokens=False)["input_ids"])


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class _Exchange:
    """One candidate's turn so far: its segments, the results between them, the calls made."""

    segments: list[Generation] = field(default_factory=list)
    results: list[tuple[int, ...]] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)

    def token_ids(self) -> tuple[int, ...]:
        ids: list[int] = []
        for i, seg in enumerate(self.segments):
            ids += seg.token_ids
            if i < len(self.results):
                ids += self.results[i]
        return tuple(ids)

    def messages(self, base: Messages, *, supported: bool) -> Messages:
        """The conversation before the last segment: base, then each earlier segment and its result."""
        out = list(base)
        for seg, call in zip(self.segments[:-1], self.calls):
            out += [{"role": "assistant", "content": seg.text}, result_message(call, supported=supported)]
        return out

    def generation(self) -> Generation:
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        has_logprobs = all(s.logprobs is not None for s in self.segments)
        for i, seg in enumerate(self.segments):
            ids += seg.token_ids
            mask += [1] * len(seg.token_ids)
            logprobs += list(seg.logprobs or ())
            if i < len(self.results):
                ids += self.results[i]
                mask += [0] * len(self.results[i])
                logprobs += [0.0] * len(self.results[i])
        return Generation(
            token_ids=tuple(ids), text="\n".join(s.text for s in self.segments), truncated=any(s.truncated for s in self.segments),
            logprobs=tuple(logprobs) if has_logprobs else None, mask=tuple(mask) if self.results else None,
            calls=tuple(c.to_dict() for c in self.calls),
            segments=tuple(s.text for s in self.segments) if self.calls else (),
            segment_tokens=tuple(len(s.token_ids) for s in self.segments) if self.results else (),
        )


Sample = Callable[[list[tuple[int, ...]], int], list[list[Generation]]]
"""(prompt token ids, n) -> n generations per prompt: the sampler's `sample` for this agent."""


def tool_turn(
    sample: Sample, tokenizer: Any, prompts: Sequence[tuple[tuple[int, ...], Messages]], n: int, tools: Sequence[Tool],
    *, max_calls: int, supported: bool, end_ids: Sequence[int], run: Callable[[Sequence[Callable[[], ToolCall]]], Any] | None = None,
    room: int | None = None,
) -> list[list[Generation]]:
    """`n` candidates for each (prompt ids, prompt messages), each calling tools up to `max_calls`
    times: after each segment that calls one, the call runs, its result is appended and the
    candidate generates on. All candidates waiting for their next segment generate in one batch.

    `room` is the longest prompt the model can continue (its context less a segment's
    `max_new_tokens`): a candidate whose conversation has grown past it ends its turn after the
    result (kept, masked like every result) instead of generating past the model's context."""
    by_name = {t.name: t for t in tools}
    first = sample([ids for ids, _ in prompts], n)
    exchanges = [[_Exchange(segments=[g]) for g in group] for group in first]
    for _ in range(max_calls):
        waiting: list[tuple[int, _Exchange, ToolCall]] = []
        for i, group in enumerate(exchanges):
            for ex in group:
                if len(ex.results) == len(ex.segments):  # out of room: its turn ended after a result
                    continue
                last = ex.segments[-1]
                call = None if last.truncated and CALL_END not in last.text else parse_call(last.text)
                if call is not None:
                    waiting.append((i, ex, call))
        if not waiting:
            break
        runs: list[Callable[[], ToolCall]] = [functools.partial(run_call, call, by_name) for _, _, call in waiting]
        done = list(run(runs) if run is not None else (f() for f in runs))
        going_on: list[tuple[_Exchange, tuple[int, ...]]] = []
        for (i, ex, _), call in zip(waiting, done):
            ex.calls.append(call)
            base = ex.messages(prompts[i][1], supported=supported)
            ex.results.append(result_ids(tokenizer, base, tools, ex.segments[-1], call, supported=supported, end_ids=end_ids))
            prompt = tuple(prompts[i][0]) + ex.token_ids()
            if room is None or len(prompt) <= room:
                going_on.append((ex, prompt))
        if not going_on:
            break
        for (ex, _), (g,) in zip(going_on, sample([p for _, p in going_on], 1)):
            ex.segments.append(g)
    return [[ex.generation() for ex in group] for group in exchanges]
