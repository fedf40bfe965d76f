"""A script launches a merged export of a run's agent as the run page's Merge button does
(`merge_request`, `gguf_request`): 202 with the job, the same job again while it is queued, and a
400 naming the field for a checkpoint, agent or type the run does not have."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.webapp.api.test_catalog_api import api  # noqa: F401 (the fixture)
from tests.webapp.history_helpers import save_checkpoint, with_out_dir
from webapp.models import Job, Run


@pytest.fixture
def run(alice, alice_world, data_dir) -> Run:
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded")
    run = with_out_dir(alice_world.run, data_dir)
    save_checkpoint(run, 4)
    return run


def test_a_script_queues_safetensors_and_gguf_exports(api, run, jobs_sent, django_capture_on_commit_callbacks):  # noqa: F811
    url = reverse("api_run_export", args=[run.pk])
    with django_capture_on_commit_callbacks(execute=True):
        merged = api.send("POST", url, {"checkpoint_step": 4, "agent": "tool"})
        gguf = api.send("POST", url, {"checkpoint_step": 4, "agent": "tool", "format": "gguf", "gguf_type": "f16"})
    assert merged.status_code == 202 and gguf.status_code == 202, (merged.content, gguf.content)
    assert Job.objects.get(pk=merged.json()["id"]).params == {"agent": "tool", "checkpoint_step": 4, "dtype": "bfloat16"}
    assert Job.objects.get(pk=gguf.json()["id"]).params == {"agent": "tool", "checkpoint_step": 4, "format": "gguf", "gguf_type": "f16"}
    assert gguf.json()["kind"] == "merge" and gguf["Location"].endswith(reverse("api_job", args=[gguf.json()["id"]]))
    assert jobs_sent == [("merge_execute", merged.json()["id"]), ("merge_execute", gguf.json()["id"])]
    again = api.send("POST", url, {"checkpoint_step": 4, "agent": "tool", "format": "gguf", "gguf_type": "f16"})
    assert again.json()["id"] == gguf.json()["id"] and Job.objects.count() == 2  # queued already: the same job
    assert [m["job"] for m in api.get(reverse("api_run", args=[run.pk])).json()["artifacts"]["merged"]] == [gguf.json()["id"], merged.json()["id"]]

    wrong = api.send("POST", url, {"checkpoint_step": 7, "agent": "tool", "gguf_type": "q2_k"})
    assert wrong.status_code == 400 and set(wrong.json()["fields"]) == {"checkpoint_step", "gguf_type"}, wrong.json()
    nobody = api.send("POST", url, {"checkpoint_step": 4, "agent": "nobody", "format": "gguf"})
    assert nobody.status_code == 400 and nobody.json()["field"] == "agent"
    assert Job.objects.count() == 2
