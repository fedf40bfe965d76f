"""Ablations of a finished team run (`training.ablation`): the swapped team really acts with the
other agent's weights (compared by logits and parameters, not only by a number coming back), the
untrained team with the base weights, an agent alone only where the environment allows it."""

from __future__ import annotations

import pytest
import torch

from training.ablation import Ablation, AblationError, ablated_sampler, ablations_for, evaluate_ablation
from training.config import RunConfig
from training.policies import build_policies, save_policies

from .conftest import TINY_LORA, toy_config

INPUT = torch.tensor([[1, 5, 9, 13, 17, 21]])


def tiny(specialization: str) -> RunConfig:
    config = RunConfig.load(TINY_LORA).replace(**{"eval.size": 2, "data.eval_size": 2, "generation.max_new_tokens": 4})
    if specialization == "lora":
        return config
    return config.replace(**{"topology.specialization": specialization, "optim.lr": 1e-5})


def trained_checkpoint(config: RunConfig, folder) -> str:
    """The config's policies, every trainable weight moved off its init by a different amount per
    policy, saved as a checkpoint (so each agent's trained weights differ from the others' and the base)."""
    policies = build_policies(config, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for policy in policies.policies.values():
            for p in policy.params:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    out = folder / "step-000002"
    save_policies(policies, out)
    torch.save({"step": 2, "config": config.to_yaml()}, out / "trainer_state.pt")
    return str(out)


def logits(sampler, agent: str) -> torch.Tensor:
    with torch.no_grad(), sampler.policies.for_agent(agent).active() as model:
        return model(input_ids=INPUT).logits


def system_prompt(sampler, agent: str) -> str:
    state = sampler.env.reset({"question": "Compute 2 + 3.", "answer": "5"}, task_id="t", roles=sampler.roles())
    return sampler.messages(agent, state)[0]["content"]


@pytest.fixture(scope="module")
def lora(tmp_path_factory):
    config = tiny("lora")
    return config, trained_checkpoint(config, tmp_path_factory.mktemp("lora"))


def test_it_swaps_the_lora_adapters_between_roles(lora):
    config, checkpoint = lora
    with ablated_sampler(config, checkpoint, Ablation("untrained")) as (base, _):
        base_logits = logits(base, "tool")
    with ablated_sampler(config, checkpoint, Ablation("alone", "tool")) as (alone, _):
        own = {"tool": logits(alone, "tool")}
    with ablated_sampler(config, checkpoint, Ablation("alone", "reasoner")) as (alone, _):
        own["reasoner"] = logits(alone, "reasoner")
    assert not torch.allclose(own["tool"], own["reasoner"]) and not torch.allclose(own["tool"], base_logits)

    with ablated_sampler(config, checkpoint, Ablation("role_swap")) as (swapped, tasks):
        assert swapped.policies.for_agent("tool").adapter == "reasoner"
        assert swapped.policies.for_agent("reasoner").adapter == "tool"
        assert torch.allclose(logits(swapped, "tool"), own["reasoner"]) and torch.allclose(logits(swapped, "reasoner"), own["tool"])
        assert system_prompt(swapped, "tool").startswith("You are a Python programmer")  # the role keeps its prompt
        assert len(tasks) == 2


def test_it_swaps_the_whole_models_of_a_full_team(tmp_path):
    config = tiny("full")
    checkpoint = trained_checkpoint(config, tmp_path)
    with ablated_sampler(config, checkpoint, Ablation("alone", "reasoner")) as (alone, _):
        reasoner = {n: p.detach().clone() for n, p in alone.policies.for_agent("reasoner").model.named_parameters()}
    with ablated_sampler(config, checkpoint, Ablation("role_swap")) as (swapped, _):
        tool_acts_with = dict(swapped.policies.for_agent("tool").model.named_parameters())
        assert swapped.policies.for_agent("tool").name == "reasoner"
        assert all(torch.equal(tool_acts_with[n], p) for n, p in reasoner.items())
        own_tool = swapped.policies.policies["tool"].model
        assert not torch.equal(next(own_tool.parameters()), next(iter(tool_acts_with.values())))


def test_it_swaps_the_role_prompts_of_a_prompt_team_on_the_trained_model(tmp_path):
    config = tiny("prompt").replace(**{"topology.agents": [{"name": "tool", "role": "tool", "instructions": "You write code."},
                                                           {"name": "reasoner", "role": "reasoner"}]})
    checkpoint = trained_checkpoint(config, tmp_path)
    with ablated_sampler(config, checkpoint, Ablation("alone", "tool")) as (alone, _):
        trained = logits(alone, "tool")
        reasoner_default = alone.env.default_instructions["reasoner"]
    with ablated_sampler(config, checkpoint, Ablation("role_swap")) as (swapped, _):
        assert system_prompt(swapped, "tool") == reasoner_default  # its default, resolved as a rollout would
        assert system_prompt(swapped, "reasoner") == "You write code."
        assert torch.allclose(logits(swapped, "tool"), trained)  # the trained shared model, not the base
    with ablated_sampler(config, checkpoint, Ablation("untrained")) as (base, _):
        assert not torch.allclose(logits(base, "tool"), trained)
        assert system_prompt(base, "tool") == "You write code."


def test_the_untrained_team_acts_with_the_base_weights_and_is_evaluated_at_step_0(lora):
    config, checkpoint = lora
    with ablated_sampler(config, checkpoint, Ablation("untrained")) as (untrained, _):
        peft = untrained.policies.for_agent("tool").model
        with torch.no_grad(), peft.disable_adapter():
            base = peft(input_ids=INPUT).logits
        assert torch.allclose(logits(untrained, "tool"), base) and torch.allclose(logits(untrained, "reasoner"), base)
    (result,) = evaluate_ablation(config, checkpoint, Ablation("untrained"))
    assert result["step"] == 0 and result["n"] == 2 and result["temperature"] == 0.0
    assert [ep["turns"][0]["agent"] for ep in result["episodes"]] == ["tool", "tool"]  # every task it played
    assert result["ablation"] == {"kind": "untrained", "agent": None, "key": "untrained", "label": "untrained team"}
    assert set(result["agents"]) == {"tool", "reasoner"}


def test_an_agent_alone_plays_by_itself_with_its_trained_weights(lora):
    config, checkpoint = lora
    (result,) = evaluate_ablation(config, checkpoint, Ablation("alone", "reasoner"))
    assert result["step"] == 2 and result["ablation"]["label"] == "reasoner alone"
    assert set(result["agents"]) == {"reasoner"}
    assert all(t["agent"] == "reasoner" for ep in result["episodes"] for t in ep["turns"])


def test_an_agent_alone_is_refused_where_the_environment_does_not_allow_it(lora, tmp_path):
    config = toy_config("lora")  # LetterEnv declares no solo_roles
    with pytest.raises(AblationError, match=r"letters: the writer role cannot act alone; no role can \(it declares no solo_roles\)"):
        evaluate_ablation(config, None, Ablation("alone", "writer"))
    from tests.training.toy_env import LetterEnv

    assert [a.key for a in ablations_for(config, LetterEnv())] == ["role_swap", "untrained"]
    with pytest.raises(AblationError, match="one acting agent"):
        evaluate_ablation(toy_config("single"), None, Ablation("untrained"))
    with pytest.raises(AblationError, match="give the run's checkpoint"):
        evaluate_ablation(lora[0], None, Ablation("role_swap"))


def test_the_cli_ablates_a_run_folder(lora, tmp_path, capsys):
    from training.__main__ import main

    config, checkpoint = lora
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(config.to_yaml())
    (run / "checkpoints" / "step-000002").symlink_to(checkpoint)
    assert main(["ablate", str(run), "--kind", "role_swap"]) == 0
    out = capsys.readouterr().out
    assert "role swap (step 2, 2 tasks, greedy): team " in out and "step-000002" in out and "sampled" not in out
    assert main(["ablate", str(run), "--kind", "role_swap", "--sampled"]) == 0  # greedy, then at the training temperature
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("role swap")]
    assert [line.split(": team")[0] for line in lines] == [
        "role swap (step 2, 2 tasks, greedy)", f"role swap (step 2, 2 tasks, sampled at {config.generation.temperature:g})"]
    assert main(["ablate", str(run), "--kind", "alone", "--agent", "nobody"]) == 2
    assert "no acting agent 'nobody'" in capsys.readouterr().err
