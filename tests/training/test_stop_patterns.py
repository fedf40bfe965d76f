"""An environment's stop pattern ends a completion as soon as the action is complete."""

import re

import torch

from training.generation import generate
from training.models import load_model


def test_it_ends_a_completion_when_the_stop_pattern_matches():
    model, tok = load_model("tiny-random:llama")
    prompt = tok("hello", add_special_tokens=False)["input_ids"]
    gen = torch.Generator().manual_seed(0)
    free = generate(model, tok, [prompt], n=4, max_new_tokens=24, temperature=1.0, generator=torch.Generator().manual_seed(0))[0]
    # stop as soon as any character at all was produced: every completion ends within 4 tokens
    stopped = generate(model, tok, [prompt], n=4, max_new_tokens=24, temperature=1.0, generator=gen, stop=re.compile(r"\S"), stop_check_every=4)[0]
    assert all(len(g.token_ids) <= 4 and not g.truncated for g in stopped if g.text.strip())
    assert [g.token_ids[:1] for g in stopped] == [g.token_ids[:1] for g in free]  # same draws up to the stop


def test_math_tool_stops_after_the_code_fence_and_the_answer_line():
    from agents.envs import load_environment

    env = load_environment("math_tool")
    tool = re.compile(env.stop_patterns["tool"], re.DOTALL)
    assert not tool.search("```python\nprint(1 + 2)\n")
    assert tool.search("Sure.\n```python\nprint(1 + 2)\n```")
    answer = re.compile(env.stop_patterns["reasoner"], re.DOTALL)
    assert not answer.search("Answer: 4")  # could still be 42
    assert answer.search("The program is right.\nAnswer: 42\n")
