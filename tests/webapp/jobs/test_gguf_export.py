"""GGUF export from the run page: a merge job with `format: gguf` (`webapp.jobs.services.gguf_request`),
run by the worker through `training.export.export_gguf`. The round trip through llama.cpp is
tests/training/test_export_gguf.py; here the web's part: the request, its refusals, and a job
whose model the converter cannot finish failing with the reason and no files."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from tests.webapp.history_helpers import save_checkpoint, with_out_dir
from webapp.core import paths
from webapp.jobs import services as jobs
from webapp.models import Job, Run


@pytest.fixture
def run(alice, alice_world, data_dir) -> Run:
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded")
    run = with_out_dir(alice_world.run, data_dir)
    save_checkpoint(run, 4)
    return run


def test_the_run_page_queues_a_gguf_export_and_shows_why_it_failed(alice, run, jobs_sent, django_capture_on_commit_callbacks):
    assert 'value="gguf-q8_0"' in alice.client.get(reverse("run_artifacts", args=[run.pk])).content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("run_merge", args=[run.pk, 4, "tool"]), {"dtype": "gguf-q8_0"})
    assert response.status_code == 302
    job = Job.objects.get(kind="merge")
    assert jobs_sent == [("merge_execute", job.pk)]
    assert job.params == {"agent": "tool", "checkpoint_step": 4, "format": "gguf", "gguf_type": "q8_0"}
    assert "GGUF q8_0" in alice.client.get(reverse("run_artifacts", args=[run.pk])).content.decode()

    done = jobs.merge_execute(job_id=job.pk)  # tiny-random:llama's tokenizer is one llama.cpp does not know
    assert done.status == "failed" and "GGUF converter cannot convert this LlamaForCausalLM model" in done.error
    assert not done.output and not any(paths.exports_dir(run.team_id).glob("merge-*"))
    assert "cannot convert" in alice.client.get(reverse("run_artifacts", args=[run.pk])).content.decode()


def test_a_gguf_request_is_checked_and_reused(alice, run, jobs_sent):
    checkpoint = run.checkpoints.get()
    first = jobs.gguf_request(run=run, user=alice.user, checkpoint=checkpoint, agent="reasoner", gguf_type="f16")
    assert jobs.gguf_request(run=run, user=alice.user, checkpoint=checkpoint, agent="reasoner", gguf_type="f16") == first
    assert jobs.gguf_request(run=run, user=alice.user, checkpoint=checkpoint, agent="reasoner") != first  # q8_0
    assert jobs.merge_request(run=run, user=alice.user, checkpoint=checkpoint, agent="reasoner") not in (first,)  # safetensors
    with pytest.raises(ValidationError, match="Export GGUF as one of: f16, q8_0"):
        jobs.gguf_request(run=run, user=alice.user, checkpoint=checkpoint, agent="reasoner", gguf_type="q4_k")
    with pytest.raises(ValidationError, match="no adapter or model named"):
        jobs.gguf_request(run=run, user=alice.user, checkpoint=checkpoint, agent="../tool")


def test_another_team_cannot_export(bob, run, jobs_sent):
    assert bob.client.post(reverse("run_merge", args=[run.pk, 4, "tool"]), {"dtype": "gguf-f16"}).status_code == 404
    assert not Job.objects.filter(kind="merge").exists()
