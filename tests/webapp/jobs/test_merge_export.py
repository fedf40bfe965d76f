"""Export a LoRA agent merged into its base as a standalone Hugging Face model folder (a zip):
queued as a job (`PeftModel.merge_and_unload()` over `training.models.load_model(base)`), then
downloadable from the run page; the merged model computes what base + adapter computed."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch
from django.urls import reverse

from tests.webapp.history_helpers import save_checkpoint, with_out_dir
from webapp.jobs import services as jobs
from webapp.models import Job, Run


@pytest.fixture
def run(alice, alice_world, data_dir) -> Run:
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded")
    run = with_out_dir(alice_world.run, data_dir)
    save_checkpoint(run, 4)
    return run


def test_it_merges_an_adapter_into_a_standalone_model(alice, run, jobs_sent, tmp_path, django_capture_on_commit_callbacks):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from training.models import load_model

    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("run_merge", args=[run.pk, 4, "tool"]), {"dtype": "trained"})  # fp32 on a CPU
    assert response.status_code == 302
    job = Job.objects.get(kind="merge")
    assert jobs_sent == [("merge_execute", job.pk)] and job.params == {"agent": "tool", "checkpoint_step": 4, "dtype": "trained"}
    assert "Queued" in alice.client.get(reverse("run_artifacts", args=[run.pk])).content.decode()

    done = jobs.merge_execute(job_id=job.pk)
    assert done.status == "succeeded", done.error
    download = alice.client.get(reverse("run_merged_download", args=[run.pk, job.pk]))
    zipfile.ZipFile(io.BytesIO(b"".join(download.streaming_content))).extractall(tmp_path)
    folder = tmp_path / f"run-{run.pk}-step-4-tool-merged"
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()

    merged = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert not any("lora" in name for name, _ in merged.named_parameters())
    base, _ = load_model("tiny-random:llama")
    with_adapter = PeftModel.from_pretrained(base, run.checkpoints.get().path + "/tool").eval()
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, with_adapter(ids).logits, atol=1e-4)
    assert "Download merged model" in alice.client.get(run.get_absolute_url()).content.decode()


def test_it_reuses_a_finished_export_and_refuses_full_models(alice, run, jobs_sent):
    checkpoint = run.checkpoints.get()
    first = jobs.merge_request(run=run, user=alice.user, checkpoint=checkpoint, agent="reasoner")
    assert jobs.merge_request(run=run, user=alice.user, checkpoint=checkpoint, agent="reasoner") == first  # still queued
    with pytest.raises(Exception, match="no adapter or model named"):
        jobs.merge_request(run=run, user=alice.user, checkpoint=checkpoint, agent="../tool")


def test_it_hides_another_teams_exports(alice, bob, run, jobs_sent):
    job = jobs.merge_request(run=run, user=alice.user, checkpoint=run.checkpoints.get(), agent="tool")
    assert bob.client.post(reverse("run_merge", args=[run.pk, 4, "tool"])).status_code == 404
    assert bob.client.get(reverse("run_merged_download", args=[run.pk, job.pk])).status_code == 404
    assert alice.client.get(reverse("run_merged_download", args=[run.pk, job.pk])).status_code == 404  # not ready yet
