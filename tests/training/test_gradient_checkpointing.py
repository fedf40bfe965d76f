"""`model.gradient_checkpointing` recomputes the decoder layers in the update's backward, keeps the
shared-prompt forward, and changes neither the loss nor the gradients; dropout stays off in the
update (train mode) unless `grpo.disable_dropout: false`, and generation runs in eval mode."""

import pytest
import torch

from tests.training.toy_env import LetterEnv
from training import grpo, trainer
from training.policies import build_policies
from training.rollout import Sampler
from training.update import Sample, update_policy


def _samples(policy, agent: str) -> list[Sample]:
    """Two groups of three candidates (each group shares its prompt) and one lone candidate."""
    tok = policy.tokenizer
    one = tuple(tok("hello there, how are you", add_special_tokens=False)["input_ids"])
    two = tuple(tok("what is two and two", add_special_tokens=False)["input_ids"])
    lone = tuple(tok("a prompt of its own", add_special_tokens=False)["input_ids"])
    return [
        Sample(agent, one, (5, 6, 7, 8), advantage=1.0),
        Sample(agent, one, (9, 10, 11), advantage=-0.5),
        Sample(agent, one, (12, 13, 14, 15, 16), advantage=-0.5),
        Sample(agent, two, (17, 18), advantage=0.7),
        Sample(agent, two, (19, 20, 21, 22), advantage=-0.7),
        Sample(agent, two, (23, 24, 25), advantage=0.0),
        Sample(agent, lone, (26, 27, 28), advantage=0.3),
    ]


def _policy(make_config, specialization: str, *, checkpointing: bool, **overrides):
    config = make_config(specialization).replace(**{"model.gradient_checkpointing": checkpointing, **overrides})
    policy = build_policies(config, device=torch.device("cpu")).for_agent("writer")
    if specialization == "lora":
        with torch.no_grad():  # B starts at zero: give every adapter weight a gradient
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.1)
    return config, policy


def _decoder_layers(model) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__ == "LlamaDecoderLayer"]


class _Counter:
    """Counts the decoder layers' MLP calls in the forward and, separately, inside backward():
    transformers checkpoints a layer's `forward` (hooks on the layer itself would not see the
    replay), and the replay may stop after the MLP's last saved tensor, so a pre-hook counts."""

    def __init__(self, model, monkeypatch):
        self.forward = self.replayed = 0
        self.in_backward = False
        for layer in _decoder_layers(model):
            layer.mlp.register_forward_pre_hook(self._hook)
        real = torch.Tensor.backward

        def backward(tensor, *args, **kwargs):
            self.in_backward = True
            try:
                return real(tensor, *args, **kwargs)
            finally:
                self.in_backward = False

        monkeypatch.setattr(torch.Tensor, "backward", backward)

    def _hook(self, module, args):
        if self.in_backward:
            self.replayed += 1
        elif torch.is_grad_enabled():
            self.forward += 1


@pytest.mark.parametrize("specialization", ["prompt", "lora", "full"])
def test_it_recomputes_every_decoder_layer_in_the_backward(make_config, monkeypatch, specialization):
    config, policy = _policy(make_config, specialization, checkpointing=True)
    counter = _Counter(policy.model, monkeypatch)
    shared = []
    real = grpo._shared_prompt_logits

    def spy(*args):
        logits = real(*args)
        shared.append(logits is not None)
        return logits

    monkeypatch.setattr(grpo, "_shared_prompt_logits", spy)

    update_policy(policy, _samples(policy, "writer"), config, step=1)

    layers = len(_decoder_layers(policy.model))
    assert counter.forward > 0 and counter.forward % layers == 0
    assert counter.replayed == counter.forward, "every layer of every forward with grad runs again in the backward"
    assert any(shared), "the groups' prompts were forwarded once each under checkpointing"


def test_without_checkpointing_nothing_is_recomputed(make_config, monkeypatch):
    config, policy = _policy(make_config, "lora", checkpointing=False)
    counter = _Counter(policy.model, monkeypatch)
    update_policy(policy, _samples(policy, "writer"), config, step=1)
    assert counter.forward > 0 and counter.replayed == 0


def _gradients(make_config, monkeypatch, specialization: str, *, checkpointing: bool, **overrides):
    config, policy = _policy(make_config, specialization, checkpointing=checkpointing, **overrides)
    grads = []
    real_step = policy.optimizer.step

    def step(*args, **kwargs):
        grads.append(torch.cat([p.grad.flatten() for p in policy.params]))
        return real_step(*args, **kwargs)

    monkeypatch.setattr(policy.optimizer, "step", step)
    torch.manual_seed(1)  # the dropout masks of the runs that keep dropout on
    stats = update_policy(policy, _samples(policy, "writer"), config, step=1)
    return stats, grads


@pytest.mark.parametrize(
    ("specialization", "overrides"),
    [
        ("single", {}),
        ("prompt", {"grpo.num_iterations": 2}),
        ("lora", {}),
        ("lora", {"grpo.beta": 0.1}),
        ("lora", {"lora.dropout": 0.3, "grpo.disable_dropout": False}),  # the replay draws the forward's dropout masks again
        ("full", {"grpo.beta": 0.1}),
    ],
)
def test_checkpointing_changes_neither_the_loss_nor_the_gradients(make_config, monkeypatch, specialization, overrides):
    plain, plain_grads = _gradients(make_config, monkeypatch, specialization, checkpointing=False, **overrides)
    ckpt, ckpt_grads = _gradients(make_config, monkeypatch, specialization, checkpointing=True, **overrides)
    assert len(plain_grads) == len(ckpt_grads) == overrides.get("grpo.num_iterations", 1)
    for a, b in zip(plain_grads, ckpt_grads):
        assert a.abs().max() > 0
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6), (a - b).abs().max()
    assert ckpt["loss"] == pytest.approx(plain["loss"], rel=1e-5, abs=1e-7)
    assert ckpt["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)


def _dropout_seen(model) -> list[tuple[bool, float]]:
    """(training, p) of every LoRA dropout call."""
    seen: list[tuple[bool, float]] = []
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Dropout) and "lora_dropout" in name:
            m.register_forward_pre_hook(lambda mod, args: seen.append((mod.training, mod.p)))
    return seen


@pytest.mark.parametrize("disable", [True, False])
def test_the_update_runs_in_train_mode_with_dropout_as_configured(make_config, disable):
    config, policy = _policy(make_config, "lora", checkpointing=True, **{"lora.dropout": 0.3, "grpo.disable_dropout": disable})
    seen = _dropout_seen(policy.model)
    update_policy(policy, _samples(policy, "writer"), config, step=1)
    assert seen and all(training for training, _ in seen)
    assert {p for _, p in seen} == ({0.0} if disable else {0.3})
    assert not policy.model.training, "the update hands the model back in eval mode"


def test_disable_dropout_zeroes_module_and_attention_probabilities():
    from transformers import LlamaConfig, LlamaForCausalLM

    from training.policies import disable_dropout

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, attention_dropout=0.5
    )
    model = LlamaForCausalLM(config).train()
    ids = torch.arange(12).reshape(2, 6)
    assert not torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits), "attention dropout is on"
    disable_dropout(model)
    assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)
    assert model.config.attention_dropout == 0.5, "saved checkpoints keep the model's own dropout"


def test_evaluation_generates_in_eval_mode_when_training_keeps_dropout(make_config):
    config = make_config("lora").replace(**{"model.gradient_checkpointing": True, "lora.dropout": 0.3, "grpo.disable_dropout": False})
    policies = build_policies(config, device=torch.device("cpu"))
    writer = policies.for_agent("writer")
    seen = _dropout_seen(writer.model)
    update_policy(writer, _samples(writer, "writer"), config, step=1)
    assert seen and all(training and p == 0.3 for training, p in seen), "the update kept dropout on"
    seen.clear()
    env = LetterEnv()
    sampler = Sampler(env, policies, config, torch.Generator().manual_seed(0))
    try:
        trainer.evaluate(sampler, [(f"eval-{i}", r) for i, r in enumerate(env.generate(2, seed=1))], step=0)
    finally:
        sampler.pool.shutdown()
    assert seen and not any(training for training, _ in seen), "evaluation generated with dropout on"
