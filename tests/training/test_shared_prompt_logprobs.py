"""token_logprobs forwards a prompt shared by several rows once: same log-probs, entropies and gradients."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from training import grpo
from training.models import load_model


def _score(model, ids, attn, comp, *, share, monkeypatch):
    if not share:
        monkeypatch.setattr(grpo, "_shared_prompt_logits", lambda *a: None)
    model.zero_grad()
    logp, entropy = grpo.token_logprobs(model, ids, attn, comp, temperature=0.7)
    logp.sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    monkeypatch.undo()
    return logp.detach(), entropy, grads


def _sliding_window_model():
    """A Mistral whose attention window (4) is shorter than the prompts (7): the prompt's cache
    keeps only its last 3 positions."""
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        sliding_window=4, pad_token_id=258,
    )
    torch.manual_seed(0)
    return MistralForCausalLM(config)


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("arch", ["llama", "sliding-window"])
def test_it_gives_the_full_forwards_values_and_gradients(monkeypatch, checkpointing, arch):
    model = load_model("tiny-random:llama")[0] if arch == "llama" else _sliding_window_model()
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM"))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)  # B starts at zero: make the adapter matter
    model.train()
    torch.manual_seed(0)
    prompt_w, comp_w = 7, 5
    ids = torch.randint(0, 250, (6, prompt_w + comp_w))  # (B, P+Tc)
    ids[1:3, :prompt_w] = ids[0, :prompt_w]  # rows 0-2 share a prompt, rows 3-4 another, row 5 its own
    ids[4, :prompt_w] = ids[3, :prompt_w]
    attn = torch.ones_like(ids)
    attn[0:3, :1] = 0  # left padding
    attn[3:5, :2] = 0
    attn[1, prompt_w + 3 :] = 0  # a shorter completion (right padding)
    comp = attn[:, prompt_w:].clone()

    plain = _score(model, ids, attn, comp, share=False, monkeypatch=monkeypatch)
    assert grpo._shared_prompt_logits(model, ids, attn, (attn.cumsum(1) - 1).clamp(min=0), comp.shape[1]) is not None
    shared = _score(model, ids, attn, comp, share=True, monkeypatch=monkeypatch)
    for a, b in zip(plain, shared):
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def test_it_uses_the_plain_forward_when_no_prompt_repeats():
    model, _ = load_model("tiny-random:llama")
    ids = torch.arange(12).reshape(2, 6)
    attn = torch.ones_like(ids)
    assert grpo._shared_prompt_logits(model, ids, attn, attn.cumsum(1) - 1, 3) is None


@pytest.mark.parametrize("rows", [2, 4])
def test_it_shares_a_prompt_across_identical_rows(rows):
    model, _ = load_model("tiny-random:llama")
    ids = torch.arange(6).repeat(rows, 1)  # (rows, 6): one prompt, one completion
    attn = torch.ones_like(ids)
    logits = grpo._shared_prompt_logits(model, ids, attn, attn.cumsum(1) - 1, 2)
    assert logits is not None and logits.shape == (rows, 2, model.config.vocab_size)


def test_under_checkpointing_it_replays_the_prompt_and_the_completions_layers():
    """The prompt's forward and the completions' forward are each recomputed once in the backward."""
    model, _ = load_model("tiny-random:llama")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    calls = []
    for layer in model.model.layers:
        layer.mlp.register_forward_pre_hook(lambda m, a: calls.append(m))
    ids = torch.arange(8).repeat(3, 1)  # (3, 8): one prompt of 5, three identical completions of 3
    attn = torch.ones_like(ids)
    logp, _ = grpo.token_logprobs(model, ids, attn, attn[:, 5:])
    forward = len(calls)
    logp.sum().backward()
    assert forward == 2 * len(model.model.layers)  # the prompt once, then the completions
    assert len(calls) - forward == forward


def test_it_uses_the_plain_forward_under_the_reentrant_checkpoint():
    """The reentrant checkpoint passes no gradient to the prompt's cached states (they are not
    arguments of the completion's layers): sharing would silently drop it."""
    model, _ = load_model("tiny-random:llama")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    ids = torch.arange(6).repeat(2, 1)
    attn = torch.ones_like(ids)
    assert grpo._shared_prompt_logits(model, ids, attn, attn.cumsum(1) - 1, 2) is None


def test_it_uses_the_plain_forward_for_a_cache_that_holds_more_than_keys_and_values(monkeypatch):
    """A recurrent (linear-attention, Mamba) cache layer cannot be recorded once and read without writing."""
    from training import prompt_cache

    model, _ = load_model("tiny-random:llama")
    ids = torch.arange(6).repeat(2, 1)
    attn = torch.ones_like(ids)
    assert grpo._shared_prompt_logits(model, ids, attn, attn.cumsum(1) - 1, 2) is not None
    monkeypatch.setattr(prompt_cache, "REPLAYABLE_LAYERS", ())
    assert grpo._shared_prompt_logits(model, ids, attn, attn.cumsum(1) - 1, 2) is None
