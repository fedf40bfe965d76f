"""Every metric the engine reports is drawn on the run page or named, with its reason, as not charted;
and every chart draws a metric the engine reports. The run page's charts are one list
(`webapp.runs.series.CHARTS`): the socket streams their series and the page's script draws them from
the JSON the page carries (what it draws: tests/browser/test_run_page_charts.py).

The metrics are read from the engine itself, not from a copy of their names: a tiny GRPO run that
reaches every branch that reports one (an agent calling a tool, reward functions, the KL term,
dynamic sampling, `generation.async`, whose stale rollouts measure the sampler/trainer mismatch),
and a tiny SFT run, through the runner the worker calls, on the toy environment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from django.urls import reverse

from training.config import RunConfig
from training.events import NullSink, StepMetrics
from training.rollout import Generation, Sampler
from training.runner import train
from webapp.runs.series import AGENT_NOT_CHARTED, AGENT_SERIES, CHARTS, REWARD_FN_PREFIX, RUN_NOT_CHARTED, RUN_SERIES, chart_specs

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'


class Reported(NullSink):
    """The metric names a run reports: run-wide, and per agent."""

    def __init__(self) -> None:
        self.run: set[str] = set()
        self.agent: set[str] = set()

    def metrics(self, metrics: StepMetrics) -> None:
        self.run.update(metrics.values)
        for values in metrics.agents.values():
            self.agent.update(values)


def toy(**sections: Any) -> dict[str, Any]:
    return {
        "name": "every metric", "seed": 0, "model": {"source": "tiny-random:llama"},
        "topology": {"environment": "tests.training.toy_env:LetterEnv", "specialization": "lora", "max_turns": 2,
                     "agents": [{"name": "writer", "role": "writer", "tools": ["calculator"]}, {"name": "echo", "role": "echo"}]},
        "data": {"train_size": 8, "eval_size": 2}, "optim": {"steps": 2, "tasks_per_step": 1, "lr": 1e-2},
        "lora": {"r": 2, "alpha": 4}, "eval": {"every": 0, "size": 2}, "checkpoint": {"every": 0}, **sections,
    }


@pytest.fixture(scope="module")
def reported(tmp_path_factory: pytest.TempPathFactory) -> Reported:
    tmp = tmp_path_factory.mktemp("metrics")
    seen = Reported()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    real_sample = Sampler.sample

    def sample(self, agent, prompt_ids, n, temperature, *, tool_calls=False):  # type: ignore[no-untyped-def]
        """Half the candidates call the calculator (a random model never would); the rest is the model's."""
        groups = real_sample(self, agent, prompt_ids, n, temperature, tool_calls=tool_calls)
        if not tool_calls or n == 1:
            return groups
        call = Generation(tuple(self.policies.for_agent(agent).tokenizer(CALL, add_special_tokens=False)["input_ids"]), CALL,
                          truncated=False)
        return [[call if i % 2 == 0 else g for i, g in enumerate(group)] for group in groups]

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Sampler, "sample", sample)
            grpo = RunConfig.from_dict(toy(
                data={"train_size": 8, "eval_size": 2, "reward_fns": ["tests.agents.example_plugin:length_reward"]},
                grpo={"k": 2, "beta": 0.01, "dynamic_sampling": 1},
                generation={"max_new_tokens": 4, "max_tool_calls": 1, "async": "one_step_off", "async_sampler": "thread"},
            ))
            assert train(grpo, out_dir=tmp / "grpo", sink=seen).status == "succeeded"
        conversations = tmp / "conversations.jsonl"
        conversations.write_text("".join(json.dumps(row) + "\n" for row in [
            {"agent": "writer", "messages": [{"role": "user", "content": "Go"}, {"role": "assistant", "content": "aaaa"}]},
            {"agent": "echo", "messages": [{"role": "user", "content": "Repeat aa"}, {"role": "assistant", "content": "aa"}]},
        ]))
        sft = toy(algorithm="sft", sft={"path": str(conversations), "batch_size": 2}, generation={"max_new_tokens": 4})
        sft["topology"]["agents"][0].pop("tools")
        sft["optim"]["steps"] = 1
        assert train(RunConfig.from_dict(sft), out_dir=tmp / "sft", sink=seen).status == "succeeded"
    finally:
        torch.set_num_threads(threads)
    return seen


def test_every_run_wide_metric_is_charted_or_said_not_to_be(reported: Reported):
    fns = {key for key in reported.run if key.startswith(REWARD_FN_PREFIX)}
    assert fns, "the reward functions' series"
    loose = reported.run - fns - set(RUN_SERIES) - set(RUN_NOT_CHARTED)
    assert not loose, f"reported but neither charted (series.CHARTS) nor in series.RUN_NOT_CHARTED: {sorted(loose)}"


def test_every_per_agent_metric_is_charted_or_said_not_to_be(reported: Reported):
    loose = reported.agent - set(AGENT_SERIES) - set(AGENT_NOT_CHARTED)
    assert not loose, f"reported but neither charted (series.CHARTS) nor in series.AGENT_NOT_CHARTED: {sorted(loose)}"


def test_every_chart_and_every_reason_names_a_metric_the_engine_reports(reported: Reported):
    """A metric renamed in the engine leaves no chart drawing nothing, and no stale reason."""
    assert not set(RUN_SERIES) - reported.run, sorted(set(RUN_SERIES) - reported.run)
    assert not set(AGENT_SERIES) - reported.agent, sorted(set(AGENT_SERIES) - reported.agent)
    assert not set(RUN_NOT_CHARTED) - reported.run and not set(AGENT_NOT_CHARTED) - reported.agent
    assert not set(RUN_NOT_CHARTED) & set(RUN_SERIES) and not set(AGENT_NOT_CHARTED) & set(AGENT_SERIES)


def test_the_streamed_series_are_the_charts(reported: Reported):
    assert "async/staleness" in AGENT_SERIES and "async/wait_time" in RUN_SERIES  # streamed, and now drawn
    assert {"adv/mean", "mismatch/is_weight"} <= set(AGENT_SERIES)
    drawn = {chart.id: chart for chart in CHARTS}
    assert len(drawn) == len(CHARTS), "chart ids are unique"
    assert set(RUN_SERIES) == {key for chart in CHARTS for key in chart.run}
    assert set(AGENT_SERIES) == {chart.agent for chart in CHARTS if chart.agent}
    assert [c for c in CHARTS if c.run_prefix] == [drawn["reward-fns"]] and drawn["reward-fns"].run_prefix == REWARD_FN_PREFIX


def test_the_page_carries_the_chart_list_its_script_draws(alice, alice_world):
    html = alice.client.get(reverse("run_detail", args=[alice_world.run.pk])).content.decode()
    start = html.index('<script id="run-charts" type="application/json">') + len('<script id="run-charts" type="application/json">')
    assert json.loads(html[start:html.index("</script>", start)]) == chart_specs()
    script = (Path(__file__).resolve().parents[3] / "static" / "js" / "run-live.js").read_text()
    assert 'getElementById("run-charts")' in script  # what it draws (tests/browser/test_run_page_charts.py)
