"""SFT learns exactly the assistant's tokens, as TRL's `{% generation %}` masks give: for a template
TRL ships a training twin of, its masks themselves; for one it does not know, each assistant
message's content and its end of turn, wherever the message stands (opening the conversation after
an injected system prompt, after a tool result, between user turns). The loss is as precise as
TRL's flat cross-entropy on a real vocabulary."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from training.conversations import episode_rows
from training.models import load_tokenizer
from training.sft import encode, masking_template, token_nll

trl = pytest.importorskip("trl")
TEMPLATES = Path(trl.__file__).parent / "chat_templates"

CONVERSATIONS = [
    [{"role": "assistant", "content": "Hello there"}],  # opens the conversation
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
    [{"role": "user", "content": "Add 3 and 5"},
     {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": {"x": "3+5"}}}]},
     {"role": "tool", "content": "8"}, {"role": "assistant", "content": "It is 8."}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"},
     {"role": "assistant", "content": "hi hi"}],
]
DEFAULT_SYSTEM = (  # ChatML that injects a default system prompt, as the bundled SmolLM2's template does
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-random:llama")


def learned(tok, ids, mask) -> str:
    return tok.decode([i for i, m in zip(ids, mask) if m])


@pytest.mark.parametrize("name", ["qwen2_5", "qwen3", "llama3", "phi3"])
def test_a_template_trl_knows_is_masked_as_its_training_twin_masks_it(tok, name):
    plain, twin = (TEMPLATES / f"{name}.jinja").read_text(), (TEMPLATES / f"{name}_training.jinja").read_text()
    for conv in CONVERSATIONS:
        tok.chat_template = twin
        want = tok.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        tok.chat_template = plain
        assert masking_template(tok) == twin
        assert encode(tok, conv) == (list(want["input_ids"]), list(want["assistant_masks"])), (name, conv)


def test_an_unknown_template_learns_each_message_s_content_and_end_of_turn_wherever_it_stands(tok):
    tok.chat_template = DEFAULT_SYSTEM
    assert masking_template(tok) is None
    got = [learned(tok, *encode(tok, conv)) for conv in CONVERSATIONS]
    assert got == ["Hello there<|im_end|>", "4<|im_end|>", "<|im_end|>It is 8.<|im_end|>", "hi<|im_end|>hi hi<|im_end|>"]
    ids, mask = encode(tok, CONVERSATIONS[0])
    assert "You are a helpful AI assistant named SmolLM" in tok.decode([i for i, m in zip(ids, mask) if not m])  # context


def test_a_cut_off_candidate_gives_no_warm_start_row_and_is_counted():
    def turn(agent, *, truncated):
        return {"agent": agent, "prompt": "p", "chosen": 0, "candidates": [{"text": f"{agent} says", "truncated": truncated}]}

    rows = episode_rows({"turns": [turn("tool", truncated=True), turn("reasoner", truncated=False)]})
    assert rows.truncated == 1 and [r["agent"] for r in rows.rows] == ["reasoner"]


def test_the_loss_is_as_precise_as_trls_flat_cross_entropy_on_a_real_vocabulary():
    """(B, V, T) cross-entropy reduced over a strided vocabulary: about 7x the float32 error of
    the flat (N, V) form TRL uses, on SmolLM2's 49,152 tokens."""
    torch.manual_seed(0)
    b, t, v = 2, 65, 49_152
    logits = torch.randn(b, t, v) * 4  # (B, T, V)
    ids = torch.randint(0, v, (b, t))  # (B, T)
    model = lambda **_: SimpleNamespace(logits=logits)  # noqa: E731
    nll, _, _ = token_nll(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)})
    exact = torch.nn.functional.cross_entropy(logits[:, :-1].double().reshape(-1, v), ids[:, 1:].reshape(-1), reduction="none")
    assert float((nll.double().reshape(-1) - exact).abs().mean()) < 2e-5
