"""Each specialization updates exactly the weights it should, with its own agents' samples."""

import torch

from training.policies import build_policies
from training.update import Sample, update_policy


def _snapshot(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def _changed(before, module, predicate):
    return {n for n, p in module.named_parameters() if predicate(n) and not torch.equal(before[n], p.detach())}


def _samples(policy, agent, n=4):
    tok = policy.tokenizer
    prompt = tuple(tok("hello there", add_special_tokens=False)["input_ids"])
    completion = tuple(tok("aaaa", add_special_tokens=False)["input_ids"])
    return [Sample(agent, prompt, completion, advantage=1.0 if i % 2 else -1.0) for i in range(n)]


def test_it_updates_only_the_acting_agents_lora_adapter(make_config):
    config = make_config("lora")
    policies = build_policies(config, device=torch.device("cpu"))
    writer, echo = policies.for_agent("writer"), policies.for_agent("echo")
    assert writer.model is echo.model and writer.adapter == "writer" and echo.adapter == "echo"
    before = _snapshot(writer.model)

    update_policy(writer, _samples(writer, "writer"), config, step=1)

    assert _changed(before, writer.model, lambda n: ".writer." in n), "writer's adapter did not move"
    assert not _changed(before, writer.model, lambda n: ".echo." in n), "echo's adapter moved"
    assert not _changed(before, writer.model, lambda n: "lora_" not in n), "the frozen base moved"


def test_it_gives_each_full_model_its_own_weights_and_optimizer(make_config):
    config = make_config("full")
    policies = build_policies(config, device=torch.device("cpu"))
    writer, echo = policies.for_agent("writer"), policies.for_agent("echo")
    assert writer.model is not echo.model and writer.optimizer is not echo.optimizer
    before_w, before_e = _snapshot(writer.model), _snapshot(echo.model)

    update_policy(writer, _samples(writer, "writer"), config, step=1)

    assert _changed(before_w, writer.model, lambda n: True)
    assert not _changed(before_e, echo.model, lambda n: True)


def test_it_shares_one_policy_under_prompt_specialization(make_config):
    config = make_config("prompt")
    policies = build_policies(config, device=torch.device("cpu"))
    assert list(policies.policies) == ["shared"]
    shared = policies.for_agent("writer")
    assert shared is policies.for_agent("echo") and shared.agents == ("writer", "echo")
    before = _snapshot(shared.model)

    samples = _samples(shared, "writer", 2) + _samples(shared, "echo", 2)
    stats = update_policy(shared, samples, config, step=1)

    assert stats["samples"] == 4.0
    assert _changed(before, shared.model, lambda n: True)


def test_it_never_updates_an_agent_marked_not_trainable(make_config):
    config = make_config("lora", **{"topology.agents[1].trainable": False})
    policies = build_policies(config, device=torch.device("cpu"))
    echo = policies.for_agent("echo")
    assert not echo.trainable and echo.optimizer is None and not echo.params
    assert [p.name for p in policies.trainable()] == ["writer"]
