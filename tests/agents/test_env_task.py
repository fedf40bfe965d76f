"""The `task` environment: a team's task defined as data (roles, prompts over a row's columns,
graders), its Python grader one sandbox process for all of a step's groups, and one run of it on
the tiny model in which one grader hangs, after which no grader process is left."""

from __future__ import annotations

import json

import pytest

from agents.envs import load_environment
from agents.graders import GraderError
from tests.agents.sandbox_procs import gone
from training.config import RunConfig
from training.events import NullSink
from training.trainer import train

DEFINITION = {
    "roles": [
        {"name": "answerer", "prompt": "Question: {question} {{braces}}", "grader": "correct"},
        {"name": "checker", "prompt": "Is this right for {question}? Say OK or WRONG.", "sees_turns": True, "grader": "verdict"},
    ],
    "team": {"grader": "correct", "role": "answerer"},
    "graders": {
        "correct": {"kind": "number", "column": "answer"},
        "verdict": {"kind": "python", "code": (
            "def grade(completion, row, turns):\n"
            "    said_ok = 'OK' in completion\n"
            "    right = row['answer'] in turns[-1]['text']\n"
            "    return (1.0 if said_ok == right else 0.0), {'said_ok': float(said_ok)}\n")},
    },
}
ROW = {"question": "2 + 2", "answer": "4"}


def test_roles_see_their_columns_and_earlier_turns_and_each_grader_is_a_part():
    env = load_environment("task", definition=DEFINITION)
    assert env.roles == ("answerer", "checker")
    state = env.reset(ROW, task_id="t1", roles=("answerer", "checker"))
    assert env.observe(state, "answerer") == "Question: 2 + 2 {braces}"
    right, wrong = env.step_many(state, agent="a", role="answerer", actions=["Answer: 4", "Answer: 5"])
    assert (right.local_reward, right.team_reward, right.info["reward_parts"]) == (1.0, 1.0, {"correct": 1.0, "team-correct": 1.0})
    assert (wrong.local_reward, wrong.team_reward) == (0.0, 0.0) and not right.state.done and state.dialogue == ()
    assert env.observe(right.state, "checker").endswith("Earlier turns:\n[answerer] Answer: 4")
    ok, doubt = env.step_many(right.state, agent="c", role="checker", actions=["OK", "WRONG"])
    assert ok.info["reward_parts"] == {"verdict": 1.0, "verdict.said_ok": 1.0, "team-correct": 1.0}
    assert doubt.local_reward == 0.0 and doubt.team_reward == 1.0  # the team reward grades the answerer's turn
    assert ok.state.done and ok.state.success


@pytest.mark.parametrize(("change", "field"), [
    ({"roles": []}, "definition.roles"),
    ({"roles": [{"name": "a", "prompt": "{row.__class__}"}]}, "definition.roles[0].prompt"),
    ({"roles": [{"name": "a", "prompt": "x", "grader": "nope"}]}, "definition.roles[0].grader"),
    ({"team": {"grader": "correct", "role": "judge"}}, "definition.team"),
    ({"rounds": 0}, "definition.rounds"),
])
def test_a_bad_definition_is_refused_naming_the_field(change, field):
    with pytest.raises(GraderError) as caught:
        load_environment("task", definition={**DEFINITION, **change})
    assert caught.value.field == field


def test_a_row_without_a_prompt_column_is_refused_at_reset():
    env = load_environment("task", definition=DEFINITION)
    with pytest.raises(ValueError, match="names the column 'question'"):
        env.reset({"answer": "4"}, task_id="t9", roles=("answerer",))


class Keep(NullSink):
    def __init__(self):
        self.logs, self.steps = [], []

    def log(self, message, *, level="info"):
        self.logs.append((level, message))

    def metrics(self, m):
        self.steps.append(m)


def test_a_python_grader_is_one_process_for_a_steps_groups_until_close(spawned):
    env = load_environment("task", definition=DEFINITION)
    verdicts = []
    for i, answer in enumerate(["4", "5", "4"]):  # three states, K=2 candidates each
        state = env.reset(ROW, task_id=f"t{i}", roles=("answerer", "checker"))
        (state,) = [env.step(state, agent="a", role="answerer", action=f"Answer: {answer}").state]
        verdicts += [r.info["reward_parts"]["verdict"] for r in env.step_many(state, agent="c", role="checker", actions=["OK", "WRONG"])]
    assert verdicts == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert len(spawned) == 1 and env.workers.started == 1 and not gone(spawned[0])
    env.close()
    assert gone(spawned[0])


def test_a_run_goes_on_when_a_grader_hangs_and_logs_why(tmp_path, spawned):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"question": f"{i} + 1", "answer": str(i + 1)}) + "\n" for i in range(6)))
    hang = {**DEFINITION, "graders": {**DEFINITION["graders"], "verdict": {
        "kind": "python", "timeout_s": 0.2, "code": "def grade(completion, row):\n    while True:\n        pass\n"}}}
    config = RunConfig.from_dict({
        "name": "task", "seed": 0, "model": {"source": "tiny-random:llama"},
        "topology": {"environment": "task", "env_args": {"definition": hang}, "specialization": "lora", "max_turns": 2,
                     "agents": [{"name": "answerer", "role": "answerer"}, {"name": "checker", "role": "checker"}]},
        "data": {"path": str(rows), "eval_size": 0, "eval_fraction": 0.0},
        "grpo": {"k": 2}, "optim": {"steps": 1, "tasks_per_step": 1}, "lora": {"r": 2, "alpha": 4},
        "generation": {"max_new_tokens": 4}, "eval": {"every": 0}, "checkpoint": {"every": 0},
    })
    sink = Keep()
    result = train(config, out_dir=tmp_path / "out", sink=sink)
    assert result.status == "succeeded"
    assert "reward/fn/correct" in sink.steps[0].values and "reward/fn/verdict" not in sink.steps[0].values
    assert any(level == "warning" and "grader verdict failed on checker's turn: took longer than 0.2 s" in text for level, text in sink.logs)
    assert len(spawned) == 1 and all(gone(p) for p in spawned)  # its own timer stopped it; the run's end closed it
