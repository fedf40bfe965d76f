"""Tool turns (`training.tool_turns`): the model's segments and the tool results between them form
one sequence after the prompt, the results framed by the chat template and masked out of the
loss; at most `max_calls` calls run; a template without tool support gets the tools in the system
prompt and the results as user messages. The sampler here is scripted (fixed completions,
tokenized by the real SmolLM2 tokenizer): what is tested is the splicing, not the model."""

from __future__ import annotations

import copy

import pytest
import torch

from agents.tools import BUILTINS
from training.generation import Generation
from training.models import bundled_tokenizer
from training.tool_turns import describe_tools, messages_with_tools, render, tool_support, tool_turn

CALC = [BUILTINS["calculator"]]
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""A minimal template that renders `tools=` and `tool` messages, as Hermes-style ones do."""


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's own tokenizer, read from the bundled GGUF without converting the model."""
    return bundled_tokenizer("bundled:smollm2-135m-instruct")


class Script:
    """A sampler that answers prompts from a script, in order; it records the prompts it got."""

    def __init__(self, tok, rounds: list[list[str]], logprobs: bool = False):
        self.tok, self.rounds, self.logprobs = tok, rounds, logprobs
        self.prompts: list[list[tuple[int, ...]]] = []

    def __call__(self, prompts: list[tuple[int, ...]], n: int) -> list[list[Generation]]:
        self.prompts.append(prompts)
        texts = iter(self.rounds[len(self.prompts) - 1])
        out = []
        for _ in prompts:
            group = []
            for _ in range(n):
                text = next(texts)
                ids = tuple(self.tok(text, add_special_tokens=False)["input_ids"]) + (self.tok.convert_tokens_to_ids("<|im_end|>"),)
                group.append(Generation(ids, text, truncated=False, logprobs=tuple([-0.5] * len(ids)) if self.logprobs else None))
            out.append(group)
        return out


def start(tok, *, supported: bool = False):
    plain = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 6 * 7?"}]
    messages = messages_with_tools(plain, CALC, supported=supported)
    text = render(tok, messages, CALC, supported=supported, generation_prompt=True)
    return tuple(tok(text, add_special_tokens=False)["input_ids"]), messages, text


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'


def test_a_call_runs_and_its_result_is_spliced_in_masked_out_of_the_loss(tokenizer):
    ids, messages, text = start(tokenizer)
    assert "calculator(expression: string)" in text and describe_tools(CALC) in text  # SmolLM2's ChatML: tools in the system prompt
    script = Script(tokenizer, [[CALL, "Answer: 42", '<tool_call>{"name": "abacus", "arguments": {}}</tool_call>'],
                                ["The result is 42.\nAnswer: 42", "I have no abacus.\nAnswer: 41"]], logprobs=True)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    (group,) = tool_turn(script, tokenizer, [(ids, messages)], 3, CALC, max_calls=3, supported=False, end_ids=[end])
    called, direct, unknown = group

    assert [c["name"] for c in called.calls] == ["calculator"] and called.calls[0]["result"] == "42" and not called.calls[0]["error"]
    assert called.text == CALL + "\nThe result is 42.\nAnswer: 42"
    assert called.segments == (CALL, "The result is 42.\nAnswer: 42")  # call i came after segment i
    first = script.prompts[0][0]
    seg1 = tuple(tokenizer(CALL, add_special_tokens=False)["input_ids"]) + (end,)
    continuation = script.prompts[1][0]  # what the model saw before its second segment
    assert first == ids and continuation[: len(ids) + len(seg1)] == ids + seg1
    result = continuation[len(ids) + len(seg1):]
    assert tokenizer.decode(result) == "\n<|im_start|>user\nResult of calculator: 42<|im_end|>\n<|im_start|>assistant\n"
    assert called.token_ids == continuation[len(ids):] + tuple(tokenizer("The result is 42.\nAnswer: 42", add_special_tokens=False)["input_ids"]) + (end,)
    assert called.mask is not None and len(called.mask) == len(called.token_ids)
    zeros = [i for i, m in enumerate(called.mask) if m == 0]
    assert zeros == list(range(len(seg1), len(seg1) + len(result)))  # exactly the result's tokens
    assert called.model_tokens == len(called.token_ids) - len(result)
    assert called.logprobs is not None and all(called.logprobs[i] == 0.0 for i in zeros) and called.logprobs[0] == -0.5

    assert direct.calls == () and direct.mask is None and direct.text == "Answer: 42"
    assert unknown.calls[0]["error"].startswith("no tool 'abacus'")
    assert "Result of abacus: Error: no tool 'abacus'" in tokenizer.decode(script.prompts[1][1])
    assert len(script.prompts) == 2  # nothing called again: no third round


def test_at_most_max_calls_run_in_a_turn(tokenizer):
    ids, messages, _ = start(tokenizer)
    script = Script(tokenizer, [[CALL], [CALL], [CALL]])
    (group,) = tool_turn(script, tokenizer, [(ids, messages)], 1, CALC, max_calls=2, supported=False, end_ids=[])
    assert len(group[0].calls) == 2 and len(script.prompts) == 3  # the third segment's call is left unrun: the turn ends
    assert group[0].text.count("<tool_call>") == 3


def test_a_template_with_tool_support_gets_the_schemas_and_tool_messages(tokenizer):
    assert tool_support(tokenizer) is False  # SmolLM2's ChatML ignores tools=
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = HERMES_TEMPLATE
    assert tool_support(tok) is True
    ids, messages, text = start(tok, supported=True)
    assert '"name": "calculator"' in text and "You can call these tools" not in text
    script = Script(tok, [[CALL], ["Answer: 42"]])
    (group,) = tool_turn(script, tok, [(ids, messages)], 1, CALC, max_calls=3, supported=True, end_ids=[tok.convert_tokens_to_ids("<|im_end|>")])
    result = script.prompts[1][0][len(ids) + len(tok(CALL, add_special_tokens=False)["input_ids"]) + 1:]
    assert tok.decode(result) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    assert group[0].calls[0]["result"] == "42"


def test_the_update_leaves_tool_results_out_of_the_loss():
    from training.update import Sample, _collate

    samples = [Sample("a", (5, 6), (1, 2, 3, 4), 1.0, mask=(1, 0, 0, 1)), Sample("a", (5,), (7, 8), -1.0)]
    batch = _collate(samples, pad=0)
    assert batch["loss_mask"].tolist() == [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]]
    assert batch["completion_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]  # the results stay in the context
    assert torch.equal(batch["input_ids"][0, -4:], torch.tensor([1, 2, 3, 4]))


def test_a_run_whose_agent_calls_tools_trains_and_keeps_the_calls(make_config, tmp_path, monkeypatch):
    """The whole step on the tiny random model: its sampler is scripted to call the calculator
    (a random model never would), the rest is the real engine: the tool turn, the rollout, the
    update with the results masked, the metrics and the rollouts the sinks receive."""
    from training.events import NullSink
    from training.rollout import Sampler
    from training.trainer import train

    real_sample = Sampler.sample

    def sample(self, agent, prompt_ids, n, temperature, *, tool_calls=False):
        groups = real_sample(self, agent, prompt_ids, n, temperature, tool_calls=tool_calls)
        if not tool_calls or n == 1:  # a continuation after a result (n=1) is the model's own
            return groups
        tok = self.policies.for_agent(agent).tokenizer
        call = Generation(tuple(tok(CALL, add_special_tokens=False)["input_ids"]), CALL, truncated=False)
        return [[call if i % 2 == 0 else g for i, g in enumerate(group)] for group in groups]  # half the candidates call

    monkeypatch.setattr(Sampler, "sample", sample)
    rollouts: list[dict] = []

    class Keep(NullSink):
        def rollouts(self, step, episodes):
            rollouts.extend(episodes)

        def metrics(self, m):
            rollouts.append({"metrics": m.values})

    data = make_config("single").to_dict()
    data["topology"]["agents"][0]["tools"] = ["calculator"]
    data["generation"]["max_tool_calls"] = 1
    from training.config import RunConfig

    config = RunConfig.from_dict(data)
    assert train(config, out_dir=tmp_path, sink=Keep()).status == "succeeded"
    metrics = [r["metrics"] for r in rollouts if "metrics" in r]
    assert metrics and all(m["tool_calls"] > 0 and m["tool_errors"] == 0 for m in metrics)
    candidates = [c for ep in rollouts if "turns" in ep for t in ep["turns"] for c in t["candidates"]]
    called = [c for c in candidates if c.get("calls")]
    assert called and all(c["calls"][0]["name"] == "calculator" and c["calls"][0]["result"] == "42" for c in called)


def test_a_template_without_tool_support_is_shown_a_worked_call_before_the_task(tokenizer):
    _, messages, text = start(tokenizer)
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]  # the demonstration, then the task
    assert messages[2]["content"] == '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7"}}</tool_call>'
    assert messages[3]["content"] == "Result of calculator: 84" and messages[4]["content"] == "Answer: 84"  # the tool's real result
    assert text.rstrip().endswith("What is 6 * 7?<|im_end|>\n<|im_start|>assistant")
    assert messages_with_tools(messages[:1] + messages[-1:], CALC, supported=True) == messages[:1] + messages[-1:]


def test_a_turn_that_would_outgrow_the_models_context_ends_after_the_result(tokenizer):
    """With room for the prompt after one result but not after two, the candidate that calls again
    ends its turn after its second result (kept, masked) instead of generating past the context;
    the other answers as it would have."""
    ids, messages, _ = start(tokenizer)
    rounds = [[CALL, CALL], [CALL, "Answer: 42"], ["Answer: 42"]]
    free_script = Script(tokenizer, rounds)
    (free,) = tool_turn(free_script, tokenizer, [(ids, messages)], 2, CALC, max_calls=3, supported=False, end_ids=[])
    assert len(free[0].calls) == 2 and free[0].text.endswith("Answer: 42")
    after_two = len(free_script.prompts[2][0])  # the prompt the third segment needed

    script = Script(tokenizer, rounds)
    (group,) = tool_turn(script, tokenizer, [(ids, messages)], 2, CALC, max_calls=3, supported=False, end_ids=[], room=after_two - 1)
    assert len(script.prompts) == 2  # no third round: nobody had room for it
    long, short = group
    assert len(long.calls) == 2 and long.calls[1]["result"] == "42" and long.mask[-1] == 0 and not long.text.endswith("Answer: 42")
    assert short.text.endswith("Answer: 42") and short.token_ids == free[1].token_ids

    script = Script(tokenizer, [[CALL, CALL]])
    (group,) = tool_turn(script, tokenizer, [(ids, messages)], 2, CALC, max_calls=3, supported=False, end_ids=[], room=len(ids))
    assert len(script.prompts) == 1 and [len(g.calls) for g in group] == [1, 1] and all(g.mask[-1] == 0 for g in group)
