"""`generation.backend: llamacpp`: Troupe's sampler over llama.cpp's logits, the trained weights
pushed into llama.cpp's mapped GGUF file after each update (`training.llamacpp_backend`).

Exactness is checked against the trainer's model on the same prompts: greedy tokens identical in
F32, the same draws from the same generator, log-probs within a bound; a push after the weights
change is seen by the next generation (every specialization's weights: a whole model, a merged
LoRA adapter per agent); and a run trains end to end through it, importance-corrected."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from tests.training.conftest import DENSE_REWARD
from tests.training.test_async_rollout import Recorder
from training.config import ConfigError, RunConfig, config_warnings
from training.generation import generate
from training.plan import Plan, resolve_backend
from training.policies import build_policies
from training.trainer import train

llama_cpp = pytest.importorskip("llama_cpp", reason="needs llama-cpp-python (requirements-llamacpp.txt)")
from training.llamacpp_backend import LlamaCppGenerator, hf_weights  # noqa: E402

pytestmark = pytest.mark.usefixtures("dense_reward")


class Evaluations(Recorder):
    def __init__(self):
        super().__init__()
        self.evals: list = []

    def evaluation(self, result):
        self.evals.append(result)


def prompts_of(tok, questions=("What is 2+3?", "Name a colour.", "Write one word.")):
    return [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]) for q in questions]


@pytest.fixture
def lora_run(make_config):
    config = make_config("lora", **{"generation.backend": "llamacpp"})
    policies = build_policies(config, device=torch.device("cpu"))
    engine = LlamaCppGenerator(config, policies)
    yield config, policies, engine
    engine.close()


def both(engine, policy, prompts, **kw):
    """The same generation from llama.cpp and from the trainer's model, with equal generators."""
    mine = engine.generate(policy, prompts, generator=torch.Generator().manual_seed(7), **kw)
    with policy.active() as model:
        theirs = generate(model, policy.tokenizer, prompts, generator=torch.Generator().manual_seed(7), logprobs=True, **kw)
    return mine, theirs


def test_greedy_and_sampled_tokens_are_the_trainers_and_log_probs_agree(lora_run):
    _, policies, engine = lora_run
    policy = policies.for_agent("writer")
    prompts = prompts_of(policy.tokenizer)

    greedy, trainer = both(engine, policy, prompts, n=2, max_new_tokens=16, temperature=0.0)
    assert [[g.token_ids for g in group] for group in greedy] == [[g.token_ids for g in group] for group in trainer]
    sampled, trainer_sampled = both(engine, policy, prompts, n=3, max_new_tokens=16, temperature=1.0)
    assert [[g.token_ids for g in group] for group in sampled] == [[g.token_ids for g in group] for group in trainer_sampled]
    for group, theirs in zip(sampled, trainer_sampled):
        assert len(group) == 3
        for g, t in zip(group, theirs):
            assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
            assert max(abs(a - b) for a, b in zip(g.logprobs, t.logprobs)) < 1e-3  # F32: summation order only
            assert g.text == t.text and g.truncated == t.truncated


def test_a_push_reaches_llamacpp_for_each_agents_merged_adapter(lora_run):
    _, policies, engine = lora_run
    writer, echo = policies.for_agent("writer"), policies.for_agent("echo")
    prompts = prompts_of(writer.tokenizer)
    before = engine.generate(writer, prompts, n=1, max_new_tokens=12, temperature=0.0)
    with torch.no_grad():  # B is zero at the start: give the writer's adapter a large, non-zero update
        for p in writer.params:
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    assert engine.generate(writer, prompts, n=1, max_new_tokens=12, temperature=0.0) == before, "no push before weights_changed"

    engine.weights_changed(writer)
    after, trainer = both(engine, writer, prompts, n=1, max_new_tokens=12, temperature=0.0)
    assert [g[0].token_ids for g in after] == [g[0].token_ids for g in trainer]
    assert [g[0].token_ids for g in after] != [g[0].token_ids for g in before], "the update changed nothing llama.cpp generates"
    echo_now, echo_trainer = both(engine, echo, prompts, n=1, max_new_tokens=12, temperature=0.0)
    assert [g[0].token_ids for g in echo_now] == [g[0].token_ids for g in echo_trainer], "the other agent's adapter is its own"
    merged = dict(hf_weights(writer))
    assert not any("lora_" in name or "base_layer" in name for name in merged)


def temperatures(monkeypatch):
    """The temperature of every generation llama.cpp makes in the test."""
    seen: list[float] = []
    real = LlamaCppGenerator.generate

    def generate(self, policy, prompts, **kw):
        seen.append(kw["temperature"])
        return real(self, policy, prompts, **kw)

    monkeypatch.setattr(LlamaCppGenerator, "generate", generate)
    return seen


def test_a_run_trains_through_llamacpp_importance_corrected(make_config, tmp_path, monkeypatch):
    sink, seen = Recorder(), temperatures(monkeypatch)
    config = make_config("full", **{"optim.steps": 2, "data.reward_fn": DENSE_REWARD, "generation.backend": "llamacpp", "eval.every": 2})
    result = train(config, out_dir=tmp_path, sink=sink)

    assert result.status == "succeeded" and result.step == 2
    (plan,) = [line for line in sink.lines if line.startswith("plan: ")]
    assert "llama.cpp (importance-corrected); synchronous rollouts" in plan
    for m in sink.steps:
        for agent, values in m.agents.items():
            assert "mismatch/logp_diff" in values and "mismatch/is_weight" in values, (m.step, agent)
    assert 0.0 in seen and 1.0 in seen, "F32 weights are the trainer's dtype: the greedy held-out evaluation runs on llama.cpp too"


def test_the_async_sampler_process_generates_with_its_own_engine(make_config, tmp_path, monkeypatch):
    config = make_config("lora", **{"optim.steps": 3, "data.reward_fn": DENSE_REWARD, "generation.backend": "llamacpp",
                                    "generation.dtype": "bfloat16", "generation.async": "one_step_off", "eval.every": 3})
    plan = Plan.resolve(config, cuda=False)
    assert (plan.backend, plan.sampler) == ("llamacpp", "process")
    thread = Plan.resolve(make_config("lora", **{"generation.backend": "llamacpp", "generation.async": "one_step_off",
                                                 "generation.async_sampler": "thread"}), cuda=False)
    assert (thread.backend, thread.sampler) == ("llamacpp", "thread")
    sink, seen = Evaluations(), temperatures(monkeypatch)
    result = train(config, out_dir=tmp_path, sink=sink)

    assert result.status == "succeeded" and result.step == 3
    assert [m.values["async/staleness"] for m in sink.steps] == [0.0, 1.0, 1.0]
    for m in sink.steps:  # BF16 llama.cpp's numbers (~5e-4 on the tiny model), corrected from the first step
        for agent, values in m.agents.items():
            assert values["mismatch/logp_diff"] > 1e-4 and "mismatch/is_weight" in values, (m.step, agent)
    assert [e["step"] for e in sink.evals] == [0, 3], "the held-out evaluations ran"
    assert seen == [], ("the rollouts came from the process's engine, and BF16 over an fp32 trainer leaves the greedy "
                        "held-out evaluation to the trainer's own weights: the run's engine never generated")


def test_what_llamacpp_cannot_serve_is_refused_or_falls_back(make_config, monkeypatch):
    with pytest.raises(ConfigError, match=r"generation\.backend.*llamacpp"):
        make_config("lora", **{"generation.backend": "llama.cpp"}).validate()
    for overrides, why in [
        ({"resources.parallel": "fsdp", "resources.gpus": 2}, "one process that trains"),
        ({"model.quantization": "4bit"}, "4-bit base"),
        ({"grpo.k": 65}, r"grpo\.k.*at most 64 candidates"),
    ]:
        with pytest.raises(ConfigError, match=why):
            make_config("lora", **{"generation.backend": "llamacpp", **overrides}).validate()
    make_config("lora", **{"generation.backend": "llamacpp", "grpo.k": 64}).validate()
    config = make_config("lora", **{"generation.backend": "llamacpp"})
    backend, why = resolve_backend(config, cuda=True)
    assert backend == "hf" and "GPU" in why
    assert Plan.resolve(config, cuda=False).backend == "llamacpp"
    assert RunConfig.from_yaml(config.to_yaml()).generation.backend == "llamacpp"
    unweighted = make_config("lora", **{"generation.backend": "llamacpp", "grpo.importance_sampling": False})
    assert any("llamacpp" in w and "importance" in w for w in config_warnings(unweighted))
    real = importlib.util.find_spec  # where llama-cpp-python is not installed (a Docker image): HF, saying why
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    plan = Plan.resolve(config, cuda=False)
    assert plan.backend == "hf" and "llama-cpp-python is not installed" in plan.backend_why
    assert "HF generate (asked for llamacpp, but llama-cpp-python is not installed" in plan.describe()


def test_the_weights_files_go_to_dev_shm_only_where_they_fit():
    from training.llamacpp_backend import _shm_dir

    if not os.path.isdir("/dev/shm"):
        pytest.skip("this host has no /dev/shm")
    free = os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize
    assert _shm_dir(free * 2) is None, "more than /dev/shm holds (a container's 64 MB): the temporary folder"
    assert _shm_dir(1) == "/dev/shm"
