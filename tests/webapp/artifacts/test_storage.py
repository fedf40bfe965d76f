"""What is on disk is visible, and a team admin can make room: /storage/ shows the team's runs,
exports and uploads and the shared model cache with the disk's free space; checkpoints the
engine deleted (`checkpoint.keep`) are marked and no longer linked; a team admin deletes a
finished run's older checkpoints and merged exports (never the latest checkpoint), a member
cannot; merged models are exported in bf16 (half the size) unless asked for the training dtype."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.urls import reverse

from tests.webapp.history_helpers import save_checkpoint, with_out_dir
from webapp.artifacts import selectors as storage
from webapp.jobs import services as jobs
from webapp.models import Checkpoint, Job, Membership, Run
from webapp.runs.sink import DatabaseSink


@pytest.fixture
def run(alice, alice_world, data_dir) -> Run:
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded")
    run = with_out_dir(alice_world.run, data_dir)
    for step in (2, 4, 6):
        save_checkpoint(run, step)
    return run


def test_checkpoints_the_engine_deleted_are_marked_and_no_longer_linked(alice, run):
    Run.objects.filter(pk=run.pk).update(status="running")
    shutil.rmtree(run.checkpoints.get(step=2).path)  # what checkpoint.keep does as step 6 is saved
    DatabaseSink(run).checkpoint(6, run.checkpoints.get(step=6).path)
    assert run.checkpoints.get(step=2).deleted is not None and run.checkpoints.get(step=4).deleted is None
    assert "deleted step 2 (checkpoint.keep)" in run.log_lines.order_by("-id").first().message
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    page = alice.client.get(run.get_absolute_url()).content.decode()
    assert reverse("run_checkpoint_download", args=[run.pk, 2, "tool"]) not in page
    assert reverse("run_checkpoint_download", args=[run.pk, 4, "tool"]) in page
    assert "Checkpoints deleted from disk: step 2" in page
    assert f'<option value="{run.checkpoints.get(step=2).pk}">step 2</option>' not in page  # not offered to evaluate


def test_a_team_admin_deletes_older_checkpoints_but_not_the_latest(alice, bob, run):
    page = alice.client.get(run.get_absolute_url()).content.decode()
    assert reverse("run_checkpoint_delete", args=[run.pk, 4]) in page and reverse("run_checkpoint_delete", args=[run.pk, 6]) not in page
    response = alice.client.post(reverse("run_checkpoint_delete", args=[run.pk, 4]), follow=True)
    assert "Deleted checkpoint step 4" in response.content.decode()
    four = run.checkpoints.get(step=4)
    assert four.deleted is not None and not Path(four.path).exists()
    refused = alice.client.post(reverse("run_checkpoint_delete", args=[run.pk, 6]), follow=True).content.decode()
    assert "the run&#x27;s latest checkpoint" in refused and Path(run.checkpoints.get(step=6).path).is_dir()
    assert bob.client.post(reverse("run_checkpoint_delete", args=[run.pk, 2])).status_code == 404  # another team


def test_a_member_may_look_but_not_delete(alice, run):
    Membership.objects.filter(user=alice.user).update(role=Membership.Role.MEMBER)
    page = alice.client.get(run.get_absolute_url()).content.decode()
    assert reverse("run_checkpoint_delete", args=[run.pk, 2]) not in page
    assert alice.client.post(reverse("run_checkpoint_delete", args=[run.pk, 2])).status_code == 403
    assert run.checkpoints.get(step=2).deleted is None


def test_a_running_run_keeps_its_checkpoints(alice, run):
    Run.objects.filter(pk=run.pk).update(status="running")
    assert "still going" in storage.checkpoint_delete_blocker(checkpoint=run.checkpoints.get(step=2))


def test_merged_exports_default_to_bf16_and_can_be_deleted(alice, run, jobs_sent):
    checkpoint = run.checkpoints.get(step=6)
    small = jobs.merge_execute(job_id=jobs.merge_request(run=run, user=alice.user, checkpoint=checkpoint, agent="tool").pk)
    full = jobs.merge_execute(job_id=jobs.merge_request(run=run, user=alice.user, checkpoint=checkpoint, agent="tool", dtype="trained").pk)
    assert small.status == full.status == "succeeded", (small.error, full.error)
    assert json.loads((Path(small.output) / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((Path(full.output) / "troupe.json").read_text())["dtype"] == "float32"  # trained on a CPU: fp32
    assert storage.folder_size(small.output) < 0.7 * storage.folder_size(full.output)
    page = alice.client.get(run.get_absolute_url()).content.decode()
    assert "bf16" in page and reverse("run_export_delete", args=[run.pk, small.pk]) in page
    alice.client.post(reverse("run_export_delete", args=[run.pk, small.pk]))
    small.refresh_from_db()
    assert small.output == "" and small.result["deleted"]
    assert not (Path(run.out_dir).parent.parent / "exports" / str(run.team_id) / f"merge-{small.pk}").exists()
    assert alice.client.get(reverse("run_merged_download", args=[run.pk, small.pk])).status_code == 404


def test_the_storage_page_shows_the_teams_share_and_the_model_cache(alice, bob, run, data_dir):
    (data_dir / "models" / "smollm2-135m-instruct").mkdir(parents=True)
    (data_dir / "models" / "smollm2-135m-instruct" / "model.safetensors").write_bytes(b"\0" * 4096)
    page = alice.client.get(reverse("storage")).content.decode()
    assert f"#{run.pk} {run.name}" in page and "smollm2-135m-instruct" in page and "4.0 KB" in page
    assert "free of" in page
    assert f"#{run.pk} " not in bob.client.get(reverse("storage")).content.decode()
    assert Checkpoint.objects.filter(run=run).count() == 3 and Job.objects.count() == 0
