""""Warm start from this run": the SFT set a finished run's episodes give (the chosen candidate of
each turn of the episodes that succeeded, or reached a team reward threshold, per agent), its
preview, and the SFT run launched on it, stored as a conversations dataset; every bad input named,
nothing half-saved."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ValidationError

from training.config import ConfigError
from webapp.models import Checkpoint, Dataset, Rollout, Run
from webapp.runs import services as run_services
from webapp.runs.warmstart import warm_start_launch, warm_start_set

TOOL_PROMPT = "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"
REASONER_PROMPT = "<|im_start|>user\nThe tool said 42.<|im_end|>\n<|im_start|>assistant\n"


def _candidate(text, reward, **extra):
    return {"text": text, "reward": reward, "team": reward, "local": 0.0, "advantage": 0.0, "tokens": 3, "truncated": False, **extra}


def _episode(run, step, index, *, success, team_reward, answer="42"):
    called = _candidate("<tool_call>6*7</tool_call>\nIt is 42.", 1.0, calls=[{"name": "python", "arguments": {}, "result": "42", "error": ""}],
                        segments=["<tool_call>6*7</tool_call>", "It is 42."])
    data = {"task_id": f"t{index}", "step": step, "success": success, "team_reward": team_reward, "turns": [
        {"index": 0, "agent": "tool", "role": "tool", "prompt": TOOL_PROMPT, "chosen": 1,
         "candidates": [_candidate("no idea", 0.0), called]},
        {"index": 1, "agent": "reasoner", "role": "reasoner", "prompt": REASONER_PROMPT, "chosen": 0,
         "candidates": [_candidate(f"#### {answer}", team_reward), _candidate("#### 7", 0.0)]},
    ]}
    return Rollout.objects.create(run=run, step=step, episode=index, agent_names=["tool", "reasoner"], success=success,
                                  team_reward=team_reward, data=data)


@pytest.fixture
def finished(alice_world):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    run.refresh_from_db()
    _episode(run, 1, 0, success=True, team_reward=1.0)
    _episode(run, 2, 0, success=True, team_reward=1.0)  # the same turns again: kept once
    _episode(run, 2, 1, success=False, team_reward=0.5, answer="41")
    _episode(run, 2, 2, success=False, team_reward=0.0, answer="0")
    return run


def test_it_keeps_the_continued_candidates_of_the_episodes_that_succeeded_per_agent(finished):
    episodes = warm_start_set(run=finished)
    assert (episodes.stored, episodes.episodes, episodes.duplicates) == (4, 2, 2)
    assert episodes.counts == {"tool": 1, "reasoner": 1}
    tool, reasoner = sorted(episodes.rows, key=lambda r: r["agent"], reverse=True)
    assert tool == {"agent": "tool", "prompt": TOOL_PROMPT, "completion": [
        {"role": "assistant", "content": "<tool_call>6*7</tool_call>"}, {"role": "tool", "name": "python", "content": "42"},
        {"role": "assistant", "content": "It is 42."}]}
    assert reasoner == {"agent": "reasoner", "prompt": REASONER_PROMPT, "completion": "#### 42"}
    assert episodes.samples()["reasoner"] == [{"prompt": REASONER_PROMPT, "completion": "#### 42"}]
    assert episodes.truncated == 0


def test_a_candidate_cut_off_at_the_length_cap_is_left_out_and_counted(alice, finished):
    """A row of a cut-off candidate would teach its agent to stop where the cap cut it."""
    rollout = finished.rollouts.get(step=1)
    rollout.data["turns"][1]["candidates"][0]["truncated"] = True
    rollout.save()
    episodes = warm_start_set(run=finished)
    assert episodes.truncated == 1  # the step-1 reasoner's; step 2's copy of the same turn is kept
    assert episodes.counts == {"tool": 1, "reasoner": 1} and episodes.duplicates == 1
    page = alice.client.get(f"/runs/{finished.pk}/warm-start/")
    assert "1 turn cut off at the length cap is left out" in page.content.decode()


def test_it_keeps_the_newest_examples_within_the_upload_limits(finished, settings):
    settings.TROUPE_UPLOAD_MAX_ROWS = 3
    episodes = warm_start_set(run=finished, threshold=0.0)
    assert len(episodes.rows) == 3 and episodes.left_out == 1
    assert episodes.rows[0]["agent"] == "tool" and episodes.rows[1]["completion"] == "#### 42"  # step 2's episodes first


def test_a_threshold_takes_the_episodes_whose_team_reward_reaches_it(finished):
    episodes = warm_start_set(run=finished, threshold=0.5)
    assert episodes.episodes == 3
    assert sorted(r["completion"] for r in episodes.rows if r["agent"] == "reasoner") == ["#### 41", "#### 42"]


@pytest.mark.parametrize("threshold", [-0.1, 1.5])
def test_a_threshold_out_of_range_is_named(finished, threshold):
    with pytest.raises(ValidationError) as err:
        warm_start_set(run=finished, threshold=threshold)
    assert "between 0 and 1" in err.value.message_dict["threshold"][0]


def test_no_qualifying_episode_is_a_clear_error(finished):
    Rollout.objects.filter(run=finished).update(success=False, team_reward=0.25)
    with pytest.raises(ValidationError) as err:
        warm_start_set(run=finished)
    assert "none of its 4 stored episodes succeeded" in err.value.message_dict["threshold"][0]
    with pytest.raises(ValidationError) as err:
        warm_start_set(run=finished, threshold=0.5)
    assert "team reward ≥ 0.5 (the best has 0.25)" in err.value.message_dict["threshold"][0]


def test_a_run_without_episodes_or_still_running_is_refused(alice_world):
    run = alice_world.run
    with pytest.raises(ValidationError, match="still queued"):
        warm_start_set(run=run)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    run.refresh_from_db()
    with pytest.raises(ValidationError, match="stored no episodes"):
        warm_start_set(run=run)


def test_it_stores_the_set_and_queues_an_sft_run_from_a_checkpoint(alice, finished, enqueued, tmp_path, django_capture_on_commit_callbacks):
    checkpoint = Checkpoint.objects.create(run=finished, step=3, path=str(tmp_path / "out" / "checkpoints" / "step-000003"))
    with django_capture_on_commit_callbacks(execute=True):
        new = warm_start_launch(run=finished, user=alice.user, steps=5, batch_size=4, lr=1e-3, start_from=checkpoint)

    config = new.to_config()
    dataset = Dataset.objects.get(team=alice.team, kind=Dataset.Kind.CHATS)
    assert dataset.name == f"run #{finished.pk} episodes (succeeded)" and dataset.row_count == 2
    assert config.algorithm == "sft" and config.sft.path == str(dataset.path) and config.sft.batch_size == 4
    assert (config.optim.steps, config.optim.lr) == (5, 1e-3)
    assert (config.model.init_from.run, config.model.init_from.step) == (checkpoint.path, 3)
    assert config.topology == finished.to_config().topology and config.data == finished.to_config().data
    assert [json.loads(line)["agent"] for line in dataset.path.read_text().splitlines()] == ["tool", "reasoner"]
    assert enqueued == [new.pk] and new.topology == finished.topology and new.dataset == finished.dataset


def test_a_second_warm_start_stores_its_set_under_a_free_name(alice, finished, enqueued):
    first = warm_start_launch(run=finished, user=alice.user, steps=2)
    assert warm_start_launch(run=finished, user=alice.user, steps=2) == first  # asked again while it is queued: the same run
    assert warm_start_launch(run=finished, user=alice.user, steps=3) != first  # other settings: another
    Run.objects.filter(pk=first.pk).update(status=Run.Status.SUCCEEDED)
    warm_start_launch(run=finished, user=alice.user, steps=2)  # once it has ended, the same settings start another
    names = sorted(Dataset.objects.filter(team=alice.team, kind=Dataset.Kind.CHATS).values_list("name", flat=True))
    assert names == [f"run #{finished.pk} episodes (succeeded)", f"run #{finished.pk} episodes (succeeded) (2)",
                     f"run #{finished.pk} episodes (succeeded) (3)"]


def test_a_launch_that_fails_saves_neither_the_dataset_nor_the_run(alice, finished, monkeypatch, data_dir):
    def refuse(**kwargs):
        raise ConfigError("optim.steps", "refused")

    monkeypatch.setattr(run_services, "run_config_build", refuse)
    runs = Run.objects.count()
    with pytest.raises(ConfigError):
        warm_start_launch(run=finished, user=alice.user)
    assert Run.objects.count() == runs and not Dataset.objects.filter(kind=Dataset.Kind.CHATS).exists()
    assert not [p for p in (data_dir / "datasets").rglob("*") if p.is_file()]


def test_it_starts_only_from_the_run_s_own_kept_checkpoints(alice, alice_world, finished, tmp_path):
    other = run_services.run_create(team=alice.team, user=alice.user, name="other", config=finished.to_config())
    foreign = Checkpoint.objects.create(run=other, step=1, path=str(tmp_path / "x"))
    with pytest.raises(ValidationError) as err:
        warm_start_launch(run=finished, user=alice.user, start_from=foreign)
    assert "start_from" in err.value.message_dict
    assert not Dataset.objects.filter(kind=Dataset.Kind.CHATS).exists()


def test_the_page_previews_the_set_and_launches_the_run(alice, finished, enqueued):
    url = f"/runs/{finished.pk}/warm-start/"
    assert f'href="{url}"' in alice.client.get(finished.get_absolute_url()).content.decode()
    page = alice.client.get(url).content.decode()
    assert "<strong>2</strong> of 4 stored episodes succeeded" in page and "#### 42" in page
    preview = alice.client.get(url, {"threshold": "0.5", "steps": "20", "batch_size": "8"}, headers={"HX-Request": "true"}).content.decode()
    assert "<strong>3</strong> of 4 stored episodes team reward ≥ 0.5" in preview and "<html" not in preview
    bad = alice.client.get(url, {"threshold": "2", "steps": "20", "batch_size": "8"}, headers={"HX-Request": "true"}).content.decode()
    assert "Team reward at least: The team reward threshold must lie between 0 and 1" in bad
    bad = alice.client.get(url, {"threshold": "", "steps": "0", "batch_size": "8"}, headers={"HX-Request": "true"}).content.decode()
    assert "Steps: Ensure this value is greater than or equal to 1." in bad

    response = alice.client.post(url, {"threshold": "", "steps": "3", "batch_size": "2", "start_from": ""})
    new = Run.objects.latest("id")
    assert response.status_code == 302 and response["Location"] == new.get_absolute_url() and new.to_config().algorithm == "sft"


def test_no_qualifying_episode_shows_on_the_page_and_launches_nothing(alice, finished):
    Rollout.objects.filter(run=finished).update(success=False)
    runs = Run.objects.count()
    page = alice.client.post(f"/runs/{finished.pk}/warm-start/", {"steps": "3", "batch_size": "2"}).content.decode()
    assert "No episode of run" in page and "Set a team reward threshold instead." in page
    assert Run.objects.count() == runs and not Dataset.objects.filter(kind=Dataset.Kind.CHATS).exists()


def test_the_page_of_a_run_it_cannot_use_yet_says_why(alice, alice_world):
    """The first view (no form sent yet) of a queued run, then of a finished run without episodes."""
    run = alice_world.run
    response = alice.client.get(f"/runs/{run.pk}/warm-start/")
    assert response.status_code == 200 and "is still queued: warm start from it once it has finished" in response.content.decode()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    response = alice.client.get(f"/runs/{run.pk}/warm-start/")
    assert response.status_code == 200 and "stored no episodes to learn from" in response.content.decode()


def test_another_team_s_run_is_not_found(bob, finished):
    assert bob.client.get(f"/runs/{finished.pk}/warm-start/").status_code == 404
    assert bob.client.post(f"/runs/{finished.pk}/warm-start/", {"steps": "3", "batch_size": "2"}).status_code == 404
    assert not Dataset.objects.filter(kind=Dataset.Kind.CHATS).exists()


def test_without_a_checkpoint_it_starts_from_what_the_run_started_from(alice, finished, tmp_path):
    grand = run_services.run_create(team=alice.team, user=alice.user, name="grand", config=finished.to_config())
    Run.objects.filter(pk=grand.pk).update(status=Run.Status.SUCCEEDED)
    origin = Checkpoint.objects.create(run=grand, step=4, path=str(tmp_path / "grand" / "step-000004"))
    warm = finished.to_config().replace(**{"model.init_from.run": origin.path, "model.init_from.step": 4})
    Run.objects.filter(pk=finished.pk).update(config_yaml=warm.to_yaml())
    finished.refresh_from_db()
    new = warm_start_launch(run=finished, user=alice.user)
    assert (new.to_config().model.init_from.run, new.to_config().model.init_from.step) == (origin.path, 4)


def test_the_stored_set_previews_its_prompts_and_completions(alice, finished):
    warm_start_launch(run=finished, user=alice.user)
    preview = Dataset.objects.get(team=alice.team, kind=Dataset.Kind.CHATS).preview
    assert preview[1] == {"agent": "reasoner", "messages": f"prompt: …{REASONER_PROMPT}\nassistant: #### 42"}
