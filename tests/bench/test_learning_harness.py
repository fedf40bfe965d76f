"""bench/learning.py's own logic, in-process on the tiny-random model: one held-out set for every
seed, role swaps, agents trained alone put together, and the mean ± spread over seeds."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
learning = importlib.import_module("learning")


def args(*extra: str):
    return learning.parse_args(["--arm", "single", "--model", "tiny-random:llama", "--eval-size", "5", "--out-dir", "/unused", *extra])


def build(config):
    """(sampler, training tasks, held-out tasks) of the base models, as the harness builds them."""
    with learning.base_sampler(config) as built:
        return built


def sampler_for(arm: str, *extra: str):
    sampler, _, _ = build(learning.arm_config(arm, args(*extra)))
    return sampler


def system_prompts(sampler) -> dict[str, str]:
    state = sampler.env.reset({"question": "Compute 2 + 3.", "answer": "5"}, task_id="t", roles=sampler.roles())
    return {a: sampler.messages(a, state)[0]["content"] for a in sampler.config.topology.order()}


def test_every_seed_is_judged_on_the_same_held_out_tasks() -> None:
    _, _, held0 = build(learning.arm_config("single", args()))
    _, train1, held1 = build(learning.arm_config("prompt", args("--seed", "1")))
    _, train0, _ = build(learning.arm_config("prompt", args()))
    assert held0 == held1 and len(held0) == 5
    assert train0 != train1  # the seed still changes the training tasks
    _, _, other = build(learning.arm_config("single", args("--eval-seed", "3")))
    assert other != held0


def test_a_prompt_team_swapped_exchanges_its_role_prompts_and_gets_them_back() -> None:
    sampler = sampler_for("prompt")
    before = system_prompts(sampler)
    assert before["tool"] != before["reasoner"]
    with learning.roles_swapped(sampler):
        assert system_prompts(sampler) == {"tool": before["reasoner"], "reasoner": before["tool"]}
    assert system_prompts(sampler) == before


def test_a_lora_team_swapped_acts_with_each_others_adapters() -> None:
    sampler = sampler_for("lora")
    policies = sampler.policies
    tool, reasoner = policies.for_agent("tool"), policies.for_agent("reasoner")
    with learning.roles_swapped(sampler):
        assert policies.for_agent("tool") is reasoner and policies.for_agent("reasoner") is tool
        assert system_prompts(sampler)["tool"].startswith("You are a Python programmer")  # prompts stay
    assert policies.for_agent("tool") is tool and policies.for_agent("reasoner") is reasoner


def test_it_puts_adapters_trained_alone_into_the_team() -> None:
    team = sampler_for("alone").policies
    lone = build(learning.arm_config("alone", args(), roles=("reasoner",)))[0].policies
    with torch.no_grad():
        for name, p in lone.for_agent("reasoner").model.named_parameters():
            if ".reasoner." in name:
                p.add_(0.5)
    tool_before = {n: p.detach().clone() for n, p in team.for_agent("tool").model.named_parameters() if ".tool." in n}
    learning.put_together(team, lone, "reasoner")
    lone_w = dict(lone.for_agent("reasoner").model.named_parameters())
    moved = [n for n, p in team.for_agent("reasoner").model.named_parameters() if ".reasoner." in n]
    assert moved and all(torch.equal(dict(team.for_agent("reasoner").model.named_parameters())[n], lone_w[n]) for n in moved)
    assert all(torch.equal(p, tool_before[n]) for n, p in team.for_agent("tool").model.named_parameters() if ".tool." in n)


def run(seed: int, greedy: float, tokens: list[int], *, swapped: float | None = None) -> dict:
    evals = [{"step": 5 * (i + 1), "temperature": 0.0, "team": greedy if i == len(tokens) - 1 else 0.0, "agents": {"tool": greedy},
              "train_tokens": t} for i, t in enumerate(tokens)]
    evals.append({"step": 10, "temperature": 1.0, "team": greedy / 2, "agents": {"tool": greedy / 2}, "train_tokens": tokens[-1]})
    if swapped is not None:
        evals.append({"step": 10, "temperature": 0.0, "team": swapped, "agents": {"tool": swapped}, "swapped": True, "train_tokens": tokens[-1]})
    return {"config": {"seed": seed}, "steps": 10, "train_seconds": 60.0, "train_tokens": tokens[-1], "evals": evals}


def test_it_aggregates_the_final_evaluations_over_seeds() -> None:
    runs = {"prompt-4turns": run(0, 0.5, [100, 200], swapped=0.1), "prompt-4turns-seed1": run(1, 0.7, [100, 200], swapped=0.3),
            "single": run(0, 0.4, [50, 100])}
    groups = learning.aggregate(runs)
    assert set(groups) == {"prompt-4turns", "single"}
    g = groups["prompt-4turns"]
    assert g["seeds"] == [0, 1] and g["evals"]["greedy"]["team"] == [0.5, 0.7]
    assert g["evals"]["sampled"]["agents"]["tool"] == [0.25, 0.35] and g["evals"]["swapped"]["team"] == [0.1, 0.3]
    assert learning.mean_spread(g["evals"]["greedy"]["team"]) == "0.60 ± 0.14 (2)"
    assert learning.mean_spread([0.4]) == "0.40 (1)" and learning.mean_spread([]) == "-"


def test_at_equal_tokens_it_takes_the_last_greedy_evaluation_within_the_budget() -> None:
    r = run(0, 0.9, [100, 200, 300], swapped=0.95)
    assert learning.at_tokens(r, 250)["train_tokens"] == 200
    assert learning.at_tokens(r, 300)["team"] == 0.9  # never the swapped one
    assert learning.at_tokens(r, 99) is None


@pytest.mark.parametrize(("name", "group", "base"), [("lora-4turns-seed2", "lora-4turns", "lora"), ("untrained-self-4turns", "untrained-self-4turns", "untrained-self"),
                                                     ("single-seed1", "single", "single")])
def test_it_names_runs_by_arm_turns_and_seed(name: str, group: str, base: str) -> None:
    assert learning.group_of(name) == group and learning.base_arm(name) == base
    assert learning.result_name(base, args("--max-turns", "4", "--seed", "2")).endswith("-seed2")
    assert learning.untrained_of("self-4turns") == "untrained-self-4turns"


def test_the_curve_table_starts_each_trained_run_at_its_untrained_arm() -> None:
    untrained = {"config": {"seed": 0}, "evals": [{"step": 0, "temperature": 0.0, "team": 0.25, "agents": {}, "train_tokens": 0}]}
    text = learning.curve_table({"untrained-single": untrained, "single-seed1": run(1, 0.5, [100, 200], swapped=0.9)})
    assert "| single | 1 | step 0 / 0 tok: 0.25; step 5 / 100 tok: 0.00; step 10 / 200 tok: 0.50 |" in text
    assert "untrained-single |" not in text


def test_a_seed_stopped_early_is_named_not_averaged_with_finished_ones() -> None:
    short = {**run(1, 0.2, [100]), "steps": 5}
    g = learning.aggregate({"prompt": run(0, 0.6, [100, 200]), "prompt-seed1": short})["prompt"]
    assert g["evals"]["greedy"]["team"] == [0.6] and g["stopped"] == ["seed 1 stopped at step 5"]


def test_a_level_mix_reaches_the_environment_and_its_own_results_folder() -> None:
    mixed = args("--level", "2,3")
    assert mixed.level == [2, 3] and Path(mixed.out_dir) == Path("/unused")
    assert learning.arm_config("single", mixed).topology.env_args == {"level": [2, 3]}
    assert learning.default_out_dir(mixed).name == "math_tool-level2+3"
    _, _, held = build(learning.arm_config("single", mixed))
    assert {row["level"] for _, row in held} <= {2, 3}
    with pytest.raises(SystemExit):
        args("--level", "2,x")


def test_it_records_cpu_time_and_the_time_table_names_a_run_that_did_not_finish(tmp_path: Path) -> None:
    payload = learning.run_arm("single", args("--steps", "1", "--eval-every", "0", "--out-dir", str(tmp_path), "--work-dir", str(tmp_path)))
    assert payload["train_cpu_seconds"] > 0 and payload["eval_cpu_seconds"] > 0
    text = learning.time_table({"single": payload, "single-seed1": {**payload, "machine_end": None}})
    assert text.count("not finished") == 1 and "train CPU min" in text


def test_a_run_killed_before_its_end_is_stopped_even_when_it_is_the_only_seed() -> None:
    killed = {**run(0, 0.3, [100]), "steps": 3, "machine_start": {"time": "2026-11-26 17:00:00"}}
    groups = learning.aggregate({"self-4turns": killed, "single": {**run(0, 0.5, [50]), "machine_start": {}, "machine_end": {}}})
    assert groups["self-4turns"]["stopped"] == ["seed 0 stopped at step 3"] and groups["self-4turns"]["evals"] == {}
    assert groups["single"]["evals"]["greedy"]["team"] == [0.5]


def test_at_equal_tokens_a_run_not_yet_evaluated_within_the_budget_counts_its_untrained_figure() -> None:
    untrained = {"config": {"seed": 0}, "steps": 0, "train_seconds": 0.0, "train_tokens": 0,
                 "evals": [{"step": 0, "temperature": 0.0, "team": 0.2, "agents": {"tool": 0.2}, "train_tokens": 0}]}
    team = run(0, 0.8, [900, 1800])
    assert learning.at_tokens(team, 500, untrained)["team"] == 0.2 and learning.at_tokens(team, 500) is None
    assert learning.at_tokens(team, 900, untrained)["train_tokens"] == 900
    runs = {"untrained-multi": untrained, "prompt": team, "single": run(0, 0.5, [250, 500])}
    groups = learning.aggregate(runs)
    assert groups["prompt"]["names"] == ["prompt"]


def test_the_async_arm_trains_one_step_off_and_counts_its_last_batch_as_training_time(tmp_path: Path) -> None:
    a = args("--arm", "single-async", "--steps", "2", "--eval-every", "1", "--tasks", "1", "--k", "2", "--max-new-tokens", "4")
    config = learning.arm_config("single-async", a)
    assert config.generation.async_ == "one_step_off" and learning.result_name("single-async", a) == "single-async"
    rec = learning.Recorder("single-async", config, tmp_path / "single-async.json")
    a.work_dir = str(tmp_path)
    with learning.train(config, a, rec, label="single-async") as parts:
        assert parts.plan.sampler == "process" and parts.rollouts is not None  # the product's loop, with its async sampler
    curve = rec.payload["curve"]
    assert [c["staleness"] for c in curve] == [0.0, 1.0], "step 1 on-policy, step 2 from the weights before step 1's update"
    # greedy after each step (not at step 0: the untrained arm is step 0), sampled too at the end
    assert [(e["step"], e["temperature"] > 0) for e in rec.payload["evals"]] == [(1, False), (2, False), (2, True)]
    assert rec.payload["train_seconds"] >= sum(c["step_time"] for c in curve), "the wait for the batch in flight is training time"
    assert curve[-1]["train_tokens"] > curve[0]["train_tokens"] > 0
