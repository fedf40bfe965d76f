"""bench/team_report.py on `plan_path` experiments: the table, the lone agent's arms and what each
role did are read from the trials' stored files (written here as a sweep leaves them)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agents.envs.plan_path import PlanPath
from training.config import RunConfig
from training.experiment import ExperimentSpec

ROOT = Path(__file__).resolve().parents[2]
GRID = "S.#\n..#\n#.G"


def load_report():
    module = importlib.util.spec_from_file_location("team_report", ROOT / "bench" / "team_report.py")
    report = importlib.util.module_from_spec(module)
    module.loader.exec_module(report)
    return report


def episode(env: PlanPath, step: int, call: str, moves: str) -> dict:
    """One episode as `rollouts.jsonl` stores it, played through the environment."""
    state = env.reset({"grid": GRID}, task_id="t", roles=("tool", "plan"))
    turns = []
    for role, action in (("tool", call), ("plan", moves)):
        prompt = env.observe(state, role)
        r = env.step(state, agent={"tool": "tool", "plan": "planner"}[role], role=role, action=action)
        turns.append({"role": role, "prompt": prompt, "chosen": 0,
                      "candidates": [{"text": action, "local": r.local_reward, "tool_output": r.tool_output}]})
        state = r.state
    return {"step": step, "turns": turns}


def write_trial(folder: Path, seed: int, curve: list[tuple[int, float]], episodes: list[dict] = (),
                held_out: dict[int, list[dict]] | None = None) -> None:
    """A trial's files; `held_out`: the episodes each greedy evaluation kept, by step."""
    folder.mkdir(parents=True)
    (folder / "trial.json").write_text(json.dumps({"status": "succeeded", "seed": seed, "seconds": 60}))
    rows = [{"step": s, "temperature": t, "team": {"success": v if t == 0.0 else v / 2},
             **({"episodes": held_out[s]} if held_out and t == 0.0 else {})} for s, v in curve for t in (0.0, 1.0)]
    (folder / "evaluations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "values": {"generated_tokens": 100}}) + "\n"
                                                  for s in range(1, curve[-1][0] + 1)))
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))


def experiment(folder: Path, name: str) -> ExperimentSpec:
    spec = ExperimentSpec.load(ROOT / "configs" / "experiments" / f"{name}.yaml")
    spec = ExperimentSpec.from_dict({**spec.to_dict(), "seeds": [0, 1]}, base=spec.base)
    folder.mkdir(parents=True)
    (folder / "experiment.yaml").write_text(spec.to_yaml(), encoding="utf-8")
    return spec


@pytest.mark.parametrize("coordinates", [False, True], ids=["rows-numbered", "cells-labeled"])
def test_the_plan_path_report_reads_each_arm_and_what_each_role_did(tmp_path, capsys, coordinates: bool) -> None:
    env = PlanPath(tool="call", coordinates=coordinates)
    team, alone = tmp_path / "team", tmp_path / "alone"
    together = experiment(team, "plan-path-call")
    # seed 0 of the team trained together: at step 2 the tool names S and G right in one episode
    # of two and the planner copies it both times; before that (step 1) the tool was wrong
    played = [episode(env, 1, "path(1, 1, 2, 2)", "Moves: D R"), episode(env, 2, "path(0, 0, 2, 2)", "Moves: D R D R"),
              episode(env, 2, "path(0, 1, 2, 2)", "Moves: D D R")]
    for trial in together.trials():
        write_trial(team / f"trial-{trial.index:03d}", trial.seed, [(0, 0.25), (2, 0.5 + trial.index / 100)],
                    played if trial.index == 0 else [], held_out={0: played[:1], 2: played[1:]} if trial.index == 0 else None)
    (team / "trial-000" / "ablations.json").write_text(json.dumps({"role_swap": {"metrics": {"team.success": 0.0}}}))
    lone = experiment(alone, "plan-path-call-alone")
    for trial in lone.trials():
        write_trial(alone / f"trial-{trial.index:03d}", trial.seed, [(0, 0.03), (2, 0.05)])

    report = load_report()
    assert report.main(["--together", str(team), "--alone", str(alone), "--out", str(tmp_path / "out"), "--protocol-steps", "1"]) == 0
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| untrained team (step 0) | 0.250 ± 0.000 (min 0.250, max 0.250) | 2 |" in table
    assert "| together (lora) | 0.505 " in table and "| tool trained, planner frozen (lora) | 0.525 " in table
    assert "| together (lora): roles swapped | 0.000 (min 0.000, max 0.000) | 1 |" in table
    assert "| planner alone (lora): untrained (step 0) | 0.030 " in table and "| planner alone (lora) | 0.050 " in table
    assert "| planner alone, 2 turns (lora) | 0.050 " in table and "chance" not in table
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    roles = data["trials"][0]["protocol"]["roles"]
    assert data["trials"][0]["protocol"]["steps"] == [2, 2]
    assert roles["tool"] == {"local": 0.375, "parsed": 1.0, "right": 0.5}  # the wrong call's moves hit a wall from S
    assert roles["plan"]["copied"] == 1.0 and roles["plan"]["reached"] == 0.5
    assert "tool: local +0.38, parsed 100%, right 50% (steps 2-2)" in table
    # held out (the evaluations kept their episodes): the tool wrong at step 0, right in one of two at step 2
    assert "| step 0: plan: local +0.50, reached 0%, copied 100%; tool: local +0.50, parsed 100%, right 0%; step 2: plan:" in table
    assert data["trials"][0]["held_out_roles"]["last"]["tool"]["right"] == 0.5 and data["trials"][1]["held_out_roles"] == {}
    assert (tmp_path / "out" / "curves-steps.png").stat().st_size > 1000


def test_trials_are_one_arm_across_experiments_unless_their_configs_differ(tmp_path) -> None:
    """Seed-split experiments (`plan-path-call` seeds 0 and 1, `plan-path-call-seed2`) make one arm a
    name; an experiment whose trials change a field is its own arm, named by that field."""
    folders = []
    for name, seeds, lr in (("plan-path-call", [0, 1], None), ("plan-path-call-seed2", [2], None), ("plan-path-call-seed2", [3], 5e-4)):
        folder = tmp_path / f"{name}-{seeds[0]}"
        spec = ExperimentSpec.load(ROOT / "configs" / "experiments" / f"{name}.yaml")
        # seed 2's experiment names an environment argument at its default: the same arm as seeds 0 and 1
        base = RunConfig.from_yaml(spec.base.to_yaml(), [f"optim.lr={lr}"] if lr else ["topology.env_args.coordinates=false"])
        spec = ExperimentSpec.from_dict({**spec.to_dict(), "seeds": seeds, "name": spec.name if lr is None else "plan-path-call-lr"}, base=base)
        folder.mkdir()
        (folder / "experiment.yaml").write_text(spec.to_yaml(), encoding="utf-8")
        for trial in spec.trials():
            write_trial(folder / f"trial-{trial.index:03d}", trial.seed, [(0, 0.25), (2, 0.5)])
        folders.append(folder)

    report = load_report()
    args = [arg for f in folders for arg in ("--together", str(f))]
    assert report.main([*args, "--out", str(tmp_path / "out")]) == 0
    rows = {r["row"]: r for r in json.loads((tmp_path / "out" / "report.json").read_text())["rows"]}
    assert rows["together (lora), optim.lr=0.0002"]["seeds"] == [0, 1, 2]  # each named by the field where they differ
    assert rows["together (lora), optim.lr=0.0005"]["seeds"] == [3]
    assert rows["tool trained, planner frozen (lora), optim.lr=0.0002"]["seeds"] == [0, 1, 2]
    kept = tmp_path / "out" / "report.json"  # kept trials carry their configs: named again beside new ones
    assert report.main(["--together", str(folders[2]), "--keep", str(kept), "--out", str(tmp_path / "again")]) == 0
    again = {r["row"]: r for r in json.loads((tmp_path / "again" / "report.json").read_text())["rows"]}
    assert again["together (lora), optim.lr=0.0002"]["seeds"] == [0, 1, 2] and again["together (lora), optim.lr=0.0005"]["seeds"] == [3]
    assert report.main([*args[:4], "--out", str(tmp_path / "seeds")]) == 0  # the seed-split experiments alone: plain names
    rows = {r["row"]: r for r in json.loads((tmp_path / "seeds" / "report.json").read_text())["rows"]}
    assert rows["together (lora)"]["seeds"] == [0, 1, 2] and rows["planner trained, tool frozen (lora)"]["seeds"] == [0, 1, 2]
