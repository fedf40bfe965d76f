"""Deleting a checkpoint's files or a merged export asks first, on a page that says what goes
(its size and folder, which steps the run keeps, whether the export can be made again); the
run page's links lead there, and only the page's POST deletes."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.history_helpers import with_out_dir
from webapp.models import Checkpoint, Job, Run


def checkpoints(run, data_dir, steps):
    made = {}
    for step in steps:
        folder = data_dir / "runs" / str(run.pk) / "checkpoints" / f"step-{step:06d}" / "tool"
        folder.mkdir(parents=True)
        (folder / "adapter_model.safetensors").write_bytes(b"x" * 2048)
        made[step] = Checkpoint.objects.create(run=run, step=step, path=str(folder.parent))
    return made


def test_a_checkpoint_delete_asks_first_and_says_what_goes(alice, alice_world, data_dir):
    run = with_out_dir(alice_world.run, data_dir)
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    made = checkpoints(run, data_dir, (2, 4, 6))
    url = reverse("run_checkpoint_delete", args=[run.pk, 2])
    run_page = alice.client.get(run.get_absolute_url()).content.decode()
    assert f'href="{url}"' in run_page and f'action="{url}"' not in run_page  # a link to the question, no one-click form
    page = " ".join(alice.client.get(url).content.decode().split())
    assert "Delete checkpoint <em>step 2 of run" in page and "2.0 KB in " + made[2].path in page
    assert "it keeps steps 4, 6." in page and '<button class="danger">Delete from disk</button>' in page
    assert (data_dir / "runs" / str(run.pk) / "checkpoints" / "step-000002").exists()  # asking deleted nothing
    assert alice.client.post(url).status_code == 302
    assert Checkpoint.objects.get(pk=made[2].pk).deleted is not None
    latest = " ".join(alice.client.get(reverse("run_checkpoint_delete", args=[run.pk, 6])).content.decode().split())
    assert "latest checkpoint" in latest and "Delete from disk</button>" not in latest


def test_an_export_delete_asks_first(alice, alice_world, data_dir):
    run = with_out_dir(alice_world.run, data_dir)
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    made = checkpoints(run, data_dir, (2,))
    out = data_dir / "exports" / str(alice.team.pk) / "merge-1"
    out.mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"y" * 4096)
    job = Job.objects.create(team=alice.team, kind="merge", status="succeeded", run=run, checkpoint=made[2],
                             params={"agent": "tool"}, output=str(out))
    url = reverse("run_export_delete", args=[run.pk, job.pk])
    assert f'href="{url}"' in alice.client.get(run.get_absolute_url()).content.decode()
    page = " ".join(alice.client.get(url, {"next": reverse("storage")}).content.decode().split())
    assert "The merged model of tool goes from disk: 4.0 KB" in page and "can be merged again from it" in page
    assert f'name="next" value="{reverse("storage")}"' in page and f'href="{reverse("storage")}">Back' in page
    assert out.exists()
    assert alice.client.post(url, {"next": reverse("storage")})["Location"] == reverse("storage")
    assert not out.exists()
