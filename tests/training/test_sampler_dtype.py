"""`generation.dtype: bfloat16`: the training rollouts come from a bfloat16 copy of the trained
models (faster matmuls on a CPU with bfloat16 units), refreshed from the trainer's weights before
each step's rollouts; its numbers differ from the trainer's, so its log-probs are kept and the
update corrects with truncated importance sampling, as for vLLM. The trainer's own weights stay
in their dtype, untouched by the copy; held-out evaluation runs on them."""

from __future__ import annotations

import pytest
import torch

from tests.training.conftest import DENSE_REWARD
from tests.training.test_async_rollout import Recorder
from training import async_rollout
from training.config import ConfigError, RunConfig, config_warnings
from training.generation import generate
from training.grpo import token_logprobs
from training.plan import Plan
from training.policies import build_policies
from training.trainer import train

pytestmark = pytest.mark.usefixtures("dense_reward")


def bf16(make_config, specialization, **overrides):
    return make_config(specialization, **{"optim.steps": 2, "data.reward_fn": DENSE_REWARD, "generation.dtype": "bfloat16", **overrides})


@pytest.mark.parametrize("specialization", ["single", "prompt", "lora", "full"])
def test_a_bfloat16_copy_samples_and_every_step_is_importance_corrected(make_config, tmp_path, specialization):
    sink = Recorder()
    result = train(bf16(make_config, specialization), out_dir=tmp_path, sink=sink)

    assert result.status == "succeeded" and result.step == 2
    (plan,) = [line for line in sink.lines if line.startswith("plan: ")]
    assert "HF generate from a bfloat16 copy (importance-corrected); synchronous rollouts" in plan
    assert len(sink.steps) == 2
    for m in sink.steps:  # on-policy weights, other numbers: the correction applies from the first step
        assert "async/staleness" not in m.values
        for agent, values in m.agents.items():
            assert values["mismatch/logp_diff"] > 0 and "mismatch/is_weight" in values, (m.step, agent)


def test_the_async_sampler_keeps_the_copys_log_probs_at_staleness_0(make_config, tmp_path):
    sink = Recorder()
    train(bf16(make_config, "lora", **{"generation.async": "one_step_off", "optim.steps": 3}), out_dir=tmp_path, sink=sink)

    assert [m.values["async/staleness"] for m in sink.steps] == [0.0, 1.0, 1.0]
    for m in sink.steps:  # step 1 is on-policy, and still sampled by the bfloat16 copy: corrected
        for agent, values in m.agents.items():
            assert values["mismatch/logp_diff"] > 0 and "mismatch/is_weight" in values, (m.step, agent)
    assert any("async sampler: a process of its own" in line for line in sink.lines)


def test_the_copy_is_bfloat16_the_trainer_is_untouched_and_a_push_casts_its_weights(make_config):
    config = make_config("lora")
    policies = build_policies(config, device=torch.device("cpu"))
    model = policies.for_agent("writer").model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    copies, pairs = async_rollout.shadow_policies(policies, torch.bfloat16)
    copy = copies.for_agent("writer").model

    assert copy is copies.for_agent("echo").model, "the lora policies share one base, and one copy"
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    assert {b.dtype for b in copy.buffers() if b.is_floating_point()} <= {torch.float32}, "buffers (rotary frequencies) keep their precision"
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    mine = {id(t) for t in model.parameters()}
    assert not [n for n, p in copy.named_parameters() if id(p) in mine], "no trainer tensor is shared with (and cast by) the copy"
    assert pairs and all(dst.dtype == torch.bfloat16 and src.dtype == torch.float32 for src, dst in pairs)

    with torch.no_grad():
        for pol in policies.trainable():
            for p in pol.params:
                p.add_(0.25)
    async_rollout.push_weights(pairs)
    theirs = dict(copy.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(theirs[name], p.detach().to(torch.bfloat16)), name
        if not p.requires_grad:
            assert torch.equal(p, before[name]), f"{name}: the trainer's frozen weights changed"


def test_tied_embeddings_stay_one_parameter_in_the_copy(make_config):
    policies = build_policies(make_config("full"), device=torch.device("cpu"))
    model = policies.for_agent("writer").model
    model.lm_head.weight = model.get_input_embeddings().weight  # tied, as SmolLM2's are
    policies.for_agent("writer").params = list(model.parameters())
    copies, _ = async_rollout.shadow_policies(policies, torch.bfloat16)
    copy = copies.for_agent("writer").model
    assert copy.lm_head.weight is copy.get_input_embeddings().weight
    assert copy.lm_head.weight.dtype == torch.bfloat16


def test_the_copys_log_probs_are_its_own_and_close_to_the_trainers(make_config):
    """What the importance weights read: the copy's log-prob of each token it sampled, which the
    trainer, scoring the same tokens in float32, reproduces up to bfloat16's rounding."""
    policies = build_policies(make_config("single"), device=torch.device("cpu"))
    pol = policies.for_agent("writer")
    copies, _ = async_rollout.shadow_policies(policies, torch.bfloat16)
    copy = copies.for_agent("writer").model
    prompts = [pol.tokenizer("the letter a")["input_ids"], pol.tokenizer("b then c")["input_ids"]]
    got = generate(copy, pol.tokenizer, prompts, n=3, max_new_tokens=8, temperature=1.0,
                   generator=torch.Generator().manual_seed(0), logprobs=True)
    diffs = []
    for prompt, group in zip(prompts, got):
        for g in group:
            ids = torch.tensor([list(prompt) + list(g.token_ids)])
            with torch.no_grad():
                mine, _ = token_logprobs(pol.model, ids, torch.ones_like(ids), torch.ones((1, len(g.token_ids))), temperature=1.0)
            diffs += [abs(a - float(b)) for a, b in zip(g.logprobs, mine[0])]
    assert diffs and max(diffs) < 0.05 and max(diffs) > 0, max(diffs)


def test_bad_and_impossible_sampler_dtypes_name_the_field(make_config):
    with pytest.raises(ConfigError, match=r"generation\.dtype.*float8"):
        make_config("lora", **{"generation.dtype": "float8"}).validate()
    for overrides, why in [
        ({"generation.backend": "vllm"}, "vLLM generates in model.dtype"),
        ({"resources.parallel": "fsdp", "resources.gpus": 2}, "one process on one device"),
        ({"model.quantization": "4bit"}, "4-bit base"),
    ]:
        with pytest.raises(ConfigError, match=why):
            make_config("lora", **{"generation.dtype": "bfloat16", **overrides}).validate()
    yaml = make_config("lora").to_yaml()
    assert yaml.count("dtype: model") == 1
    yaml = yaml.replace("dtype: model", "dtype: bfloat16")
    assert RunConfig.from_yaml(yaml).generation.dtype == "bfloat16"


def test_the_plan_copies_only_when_the_trainer_is_not_bfloat16_already(make_config):
    asked = make_config("lora", **{"generation.dtype": "bfloat16"})
    assert Plan.resolve(asked, cuda=False).sampler_dtype == "bfloat16"
    assert Plan.resolve(asked.replace(**{"model.dtype": "bfloat16"}), cuda=False).sampler_dtype == ""
    assert Plan.resolve(asked, cuda=True).sampler_dtype == "", "auto trains in bfloat16 on a GPU: nothing to copy"
    assert Plan.resolve(make_config("lora"), cuda=False).sampler_dtype == ""
    assert any("generation.dtype: bfloat16" in w for w in config_warnings(asked.replace(**{"grpo.importance_sampling": False})))
