"""The referential game end to end on the tiny model, through `training.sweep`: two trials train
one agent each with the other frozen, then `apart` teams them (the speaker's adapter from one, the
listener's from the other) and `role_swap` swaps a trial's adapters; the table shows both under
their arms. Also the refusals: a partner that trained the wrong agents, `apart` under `prompt`."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agents import plugins
from training.ablation import Ablation, AblationError, ablated_sampler, partner_agents
from training.experiment import ExperimentError, ExperimentSpec
from training.sweep import format_table, run_ablations, run_sweep

ROOT = Path(__file__).resolve().parents[2]
SPREAD = "tests.training.test_referential_sweep:spread"
SPEAKER_ONLY = [{"name": "speaker", "role": "speaker"}, {"name": "listener", "role": "listener", "trainable": False}]
LISTENER_ONLY = [{"name": "speaker", "role": "speaker", "trainable": False}, {"name": "listener", "role": "listener"}]


def spread(prompts, completions, **columns):
    """The tiny random model never writes a code word or a letter, so every candidate's game reward
    is -1 (and its completions all have the same length): a number read off the text gives the
    groups a signal and the trained adapters something to learn."""
    return [sum(map(ord, c)) % 7 / 7 for c in completions]


def spec(**changes) -> ExperimentSpec:
    base = ExperimentSpec.load(ROOT / "configs" / "experiments" / "referential-apart.yaml").base
    base = base.replace(**{"model.source": "tiny-random:llama", "data.train_size": 16, "data.eval_size": 8, "eval.size": 8,
                           "eval.every": 2, "optim.steps": 2, "optim.tasks_per_step": 2, "grpo.k": 2, "lora.r": 4, "lora.alpha": 8,
                           "data.reward_fn": SPREAD, "model.init_from.run": "", "eval.sampled": True})
    data = {"name": "referential-apart", "axes": {"topology.agents": [SPEAKER_ONLY, LISTENER_ONLY]}, "seeds": [0], "ablations": ["apart", "role_swap"]}
    return ExperimentSpec.from_dict({**data, **changes}, base=base)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    plugins.register(SPREAD, kind=plugins.REWARD_FUNCTION)
    out = tmp_path_factory.mktemp("referential")
    s = spec()
    summaries = run_sweep(s, out, stream=io.StringIO())
    ablated = run_ablations(s, out, stream=io.StringIO())
    yield s, out, summaries, ablated
    plugins.unregister(SPREAD, kind=plugins.REWARD_FUNCTION)


def adapter(folder: Path, agent: str) -> dict[str, torch.Tensor]:
    (ckpt,) = sorted((folder / "checkpoints").glob("step-*"))
    return load_file(str(ckpt / agent / "adapter_model.safetensors"))


def test_each_trial_trains_only_its_trainable_agent(swept) -> None:
    _, out, summaries, _ = swept
    for trial, trained, frozen in (("trial-000", "speaker", "listener"), ("trial-001", "listener", "speaker")):
        record = json.loads((out / trial / "trial.json").read_text())
        assert record["status"] == "succeeded", record["error"]
        moved = adapter(out / trial, trained)
        still = adapter(out / trial, frozen)
        # LoRA's B matrices start at zero: the trained agent's moved, the frozen one's did not
        assert any(v.abs().sum() > 0 for k, v in moved.items() if "lora_B" in k)
        assert all(v.abs().sum() == 0 for k, v in still.items() if "lora_B" in k)
    assert [len(s.trials) for s in summaries] == [1, 1]


def test_the_second_trial_records_the_first_ones_step_zero(swept) -> None:
    """The two trials start from the same weights (each trains a different agent of one untrained
    team): the sweep evaluates that start once, the second trial records it as its own step 0."""
    _, out, _, _ = swept
    (stored,) = (out / "starts").glob("*.json")
    evaluations = [[json.loads(line) for line in (out / t / "evaluations.jsonl").read_text().splitlines()] for t in ("trial-000", "trial-001")]
    first, second = ([e for e in evals if e["step"] == 0] for evals in evaluations)
    assert len(first) == 2 and second == first == json.loads(stored.read_text())["evaluations"]  # greedy and sampled
    assert [e["step"] for e in evaluations[1]] == [0, 0, 2, 2]  # and the trial's own after training
    logs = [json.loads(line).get("message", "") for line in (out / "trial-001" / "events.jsonl").read_text().splitlines()]
    assert any("made by trial-000" in m for m in logs)


def test_apart_teams_the_two_trials_and_role_swap_is_stored_per_trial(swept) -> None:
    s, out, summaries, ablated = swept
    first = json.loads((out / "trial-000" / "ablations.json").read_text())
    second = json.loads((out / "trial-001" / "ablations.json").read_text())
    assert first["apart"]["partner"] == "trial-001" and second["apart"]["partner"] == "trial-000"
    assert first["apart"]["metrics"] == second["apart"]["metrics"]  # one team, seen from either half
    assert 0.0 <= first["apart"]["metrics"]["team.success"] <= 1.0
    # the runs evaluate sampled too (eval.sampled), so their ablations do: both numbers are stored
    assert 0.0 <= first["apart"]["metrics"]["sampled.team.success"] <= 1.0 and "sampled.team.success" in first["role_swap"]["metrics"]
    assert "sampled.team.success" in json.loads((out / "trial-000" / "trial.json").read_text())["metrics"]
    assert "team.success" in first["role_swap"]["metrics"]
    table = format_table(s, summaries, ablated)
    assert table.count("↳ trained apart") == 2 and table.count("↳ role swap") == 2

    calls: list = []
    run_ablations(s, out, evaluate=lambda *a, **k: calls.append(a) or [], stream=io.StringIO())
    assert calls == []  # stored results are kept


def test_the_apart_team_acts_with_each_agents_trained_adapter(swept) -> None:
    s, out, _, _ = swept
    config = s.trials()[0].config
    (ckpt,) = sorted((out / "trial-000" / "checkpoints").glob("step-*"))
    with ablated_sampler(config, ckpt, Ablation("apart"), partner=out / "trial-001") as (sampler, tasks):
        assert len(tasks) == 8
        for agent, trial in (("speaker", "trial-000"), ("listener", "trial-001")):
            weights = sampler.policies.policies[agent].model.state_dict()
            for key, value in adapter(out / trial, agent).items():
                loaded = next(v for k, v in weights.items() if k.endswith(key.removesuffix(".weight") + f".{agent}.weight"))
                assert torch.equal(loaded, value)


def test_apart_is_refused_without_a_matching_partner(swept) -> None:
    s, out, _, _ = swept
    speaker_run = s.trials()[0].config
    with pytest.raises(AblationError, match="exactly the agents this run froze"):
        partner_agents(speaker_run, speaker_run)
    with pytest.raises(AblationError, match="needs the partner run"):
        with ablated_sampler(speaker_run, out / "trial-000", Ablation("apart")):
            pass
    with pytest.raises(AblationError, match="share one model"):
        with ablated_sampler(speaker_run.replace(**{"topology.specialization": "prompt"}), out / "trial-000", Ablation("apart"),
                             partner=out / "trial-001"):
            pass


def test_the_spec_refuses_unknown_or_repeated_ablations() -> None:
    with pytest.raises(ExperimentError) as exc:
        spec(ablations=["apart", "apart", "nope"])
    fields = {p.field for p in exc.value.problems}
    assert fields == {"ablations[1]", "ablations[2]"}
    assert spec().to_dict()["ablations"] == ["apart", "role_swap"]


def test_the_cli_teams_two_runs_trained_apart(swept, capsys) -> None:
    from training.__main__ import main

    _, out, _, _ = swept
    assert main(["ablate", str(out / "trial-000"), "--kind", "apart"]) == 2
    assert "--kind apart needs --partner" in capsys.readouterr().err
    assert main(["ablate", str(out / "trial-000"), "--kind", "role_swap", "--partner", str(out / "trial-001")]) == 2
    assert main(["ablate", str(out / "trial-000"), "--kind", "apart", "--partner", str(out / "trial-001")]) == 0
    printed = capsys.readouterr().out
    stored = json.loads((out / "trial-000" / "ablations.json").read_text())["apart"]["metrics"]["team.success"]
    assert f"trained apart (step 2, 8 tasks, greedy): team {stored:.3f}" in printed


def test_the_report_is_built_from_the_stored_results(swept, tmp_path, capsys) -> None:
    import importlib.util

    module = importlib.util.spec_from_file_location("team_report", ROOT / "bench" / "team_report.py")
    report = importlib.util.module_from_spec(module)
    module.loader.exec_module(report)
    _, out, _, _ = swept
    assert report.main(["--apart", str(out), "--out", str(tmp_path)]) == 0
    table = (tmp_path / "table.md").read_text()
    stored = json.loads((out / "trial-000" / "ablations.json").read_text())["apart"]["metrics"]["team.success"]
    assert "| speaker trained, listener frozen (lora) |" in table and "| listener trained, speaker frozen (lora) |" in table
    assert table.count("| trained apart, then teamed |") == 1 and f"| 1 | {stored:.3f} |" in table
    sampled = json.loads((out / "trial-000" / "ablations.json").read_text())["apart"]["metrics"]["sampled.team.success"]
    # greedy per seed, then sampled (one seed: no interval)
    assert f"| 1 | {stored:.3f} | {sampled:.3f} (min {sampled:.3f}, max {sampled:.3f}) | {sampled:.3f} |" in table
    data = json.loads((tmp_path / "report.json").read_text())
    assert [t["curve"][0][0] for t in data["trials"]] == [0, 0] and all(t["protocol"]["speaker"] for t in data["trials"])
    assert (tmp_path / "curves-steps.png").stat().st_size > 1000 and (tmp_path / "curves-tokens.png").stat().st_size > 1000
    assert report.main(["--together", str(tmp_path / "nowhere")]) == 2

    # an earlier report's trials (another experiment, seed 1) join the arms they belong to
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"trials": [{**t, "experiment": "referential-lean", "seed": 1} for t in data["trials"]]}))
    assert report.main(["--apart", str(out), "--keep", str(earlier), "--out", str(tmp_path / "kept")]) == 0
    kept = (tmp_path / "kept" / "table.md").read_text()
    assert f"| 2 | {stored:.3f} {stored:.3f} |" in kept and kept.count("| trained apart, then teamed |") == 1
    assert report.main(["--apart", str(out), "--keep", str(tmp_path / "table.md"), "--out", str(tmp_path / "kept")]) == 2


def test_a_sweep_of_some_seeds_trains_and_ablates_only_theirs(tmp_path) -> None:
    """`sweep --seeds 1`: seed 1's trials and their ablations, none of seed 0's; its `apart` pairs
    the two seed-1 trials without waiting for seed 0's, which no sweep has started."""
    from training.events import TrainResult

    s = spec(seeds=[0, 1])
    trained: list[int] = []

    def train(config, *, out_dir, sink, hooks=None):
        trained.append(config.seed)
        (Path(out_dir) / "checkpoints" / "step-000002").mkdir(parents=True)
        (Path(out_dir) / "config.yaml").write_text(config.to_yaml(), encoding="utf-8")
        return TrainResult(status="succeeded", step=2, evaluations=[{"step": 2, "temperature": 0.0, "team": {"success": 0.5}}])

    evaluated: list = []

    def evaluate(config, checkpoint, ablation, partner=None):
        evaluated.append((config.seed, ablation.kind, partner.name if partner else None))
        return [{"step": 2, "temperature": 0.0, "team": {"success": 0.25}}]

    said = io.StringIO()
    summaries = run_sweep(s, tmp_path, train=train, stream=said, seeds=[1])
    assert trained == [1, 1] and [len(a.trials) for a in summaries] == [1, 1]
    assert "trial-000, trial-002" in said.getvalue() and "their seeds were not asked for" in said.getvalue()
    run_ablations(s, tmp_path, evaluate=evaluate, stream=said, seeds=[1])
    assert "waits" not in said.getvalue()
    assert sorted(evaluated) == [(1, "apart", "trial-003"), (1, "role_swap", None), (1, "role_swap", None)]
    assert json.loads((tmp_path / "trial-003" / "ablations.json").read_text())["apart"]["partner"] == "trial-001"
    assert not (tmp_path / "trial-000").exists() and not (tmp_path / "trial-002").exists()

    evaluated.clear()
    run_sweep(s, tmp_path, train=train, stream=io.StringIO())  # then the rest: seed 0's, seed 1's kept
    run_ablations(s, tmp_path, evaluate=evaluate, stream=io.StringIO())
    assert trained == [1, 1, 0, 0] and sorted(evaluated) == [(0, "apart", "trial-002"), (0, "role_swap", None), (0, "role_swap", None)]
