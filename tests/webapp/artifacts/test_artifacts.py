"""Take the trained agents away: each agent's adapter (or full model) at a checkpoint as a zip,
the config YAML, metrics as CSV and JSONL, rollouts as JSONL, all streamed. Downloads are
authorized like pages: another team gets a 404, an anonymous visitor the login page."""

from __future__ import annotations

import csv
import io
import json
import zipfile

import pytest
from django.test import Client
from django.urls import reverse

from tests.webapp.history_helpers import add_metrics, add_rollouts, save_checkpoint, with_out_dir
from webapp.artifacts import files as artifacts
from webapp.artifacts.downloads import streamed
from webapp.models import Checkpoint


def body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


@pytest.fixture
def trained(alice, alice_world, data_dir):
    run = with_out_dir(alice_world.run, data_dir)
    add_metrics(run, 5)
    add_rollouts(run, 3)
    checkpoint = save_checkpoint(run, 5)
    return run, checkpoint


def test_it_lists_and_zips_each_agents_adapter(alice, trained):
    run, checkpoint = trained
    page = alice.client.get(run.get_absolute_url()).content.decode()
    url = reverse("run_checkpoint_download", args=[run.pk, 5, "tool"])
    assert url in page and "LoRA adapter (PEFT)" in page and "Export merged model" in page
    response = alice.client.get(url)
    assert response.streaming and response["Content-Type"] == "application/zip"
    assert f'filename="run-{run.pk}-step-5-tool-adapter.zip"' in response["Content-Disposition"]
    archive = zipfile.ZipFile(io.BytesIO(body(response)))
    assert archive.testzip() is None
    root = f"run-{run.pk}-step-5-tool-adapter"
    assert {f"{root}/adapter_config.json", f"{root}/adapter_model.safetensors"} <= set(archive.namelist())
    on_disk = (artifacts.checkpoint_folder(run=run, checkpoint=checkpoint) / "tool" / "adapter_model.safetensors").read_bytes()
    assert archive.read(f"{root}/adapter_model.safetensors") == on_disk


def test_it_loads_a_downloaded_adapter_with_peft(alice, trained, tmp_path):
    from peft import PeftModel

    from training.models import load_model

    run, _ = trained
    zipfile.ZipFile(io.BytesIO(body(alice.client.get(reverse("run_checkpoint_download", args=[run.pk, 5, "reasoner"]))))).extractall(tmp_path)
    base, _ = load_model("tiny-random:llama")
    model = PeftModel.from_pretrained(base, str(tmp_path / f"run-{run.pk}-step-5-reasoner-adapter"))
    assert any("lora_B" in n and p.abs().sum() > 0 for n, p in model.named_parameters())


def test_it_serves_config_metrics_and_rollouts(alice, trained):
    run, _ = trained
    config = alice.client.get(reverse("run_file", args=[run.pk, "config.yaml"]))
    assert config.content.decode() == run.config_yaml and "attachment" in config["Content-Disposition"]
    table = list(csv.DictReader(io.StringIO(body(alice.client.get(reverse("run_file", args=[run.pk, "metrics.csv"]))).decode())))
    assert [r["step"] for r in table] == ["1", "2", "3", "4", "5"]
    assert float(table[-1]["reward/total"]) == 0.05 and "tool:reward/total" in table[0] and "reasoner:loss" in table[0]
    lines = body(alice.client.get(reverse("run_file", args=[run.pk, "metrics.jsonl"]))).decode().splitlines()
    assert json.loads(lines[0])["agents"]["tool"]["loss"] == 0.5
    episodes = [json.loads(x) for x in body(alice.client.get(reverse("run_file", args=[run.pk, "rollouts.jsonl"]))).decode().splitlines()]
    assert len(episodes) == 6 and episodes[0]["question"] == "Compute 1 + 0." and episodes[0]["episode"] == 0
    assert alice.client.get(reverse("run_file", args=[run.pk, "secrets.txt"])).status_code == 404


def test_it_says_when_a_checkpoint_left_the_disk(alice, trained):
    import shutil

    run, checkpoint = trained
    shutil.rmtree(checkpoint.path)
    assert "deleted from disk" in alice.client.get(run.get_absolute_url()).content.decode()
    assert alice.client.get(reverse("run_checkpoint_download", args=[run.pk, 5, "tool"])).status_code == 404


def test_it_never_reads_outside_the_runs_folder(alice, trained, tmp_path):
    run, _ = trained
    outside = tmp_path / "elsewhere" / "step-000009"
    (outside / "tool").mkdir(parents=True)
    (outside / "tool" / "adapter_config.json").write_text("{}")
    Checkpoint.objects.create(run=run, step=9, path=str(outside))
    assert alice.client.get(reverse("run_checkpoint_download", args=[run.pk, 9, "tool"])).status_code == 404
    for name in ("..", "trainer_state.pt", "tool/../reasoner"):
        assert alice.client.get(f"/runs/{run.pk}/checkpoints/5/{name}.zip").status_code == 404


def test_it_authorizes_downloads_like_pages(bob, trained):
    run, _ = trained
    urls = [reverse("run_checkpoint_download", args=[run.pk, 5, "tool"])] + [
        reverse("run_file", args=[run.pk, name]) for name in ("config.yaml", "metrics.csv", "metrics.jsonl", "rollouts.jsonl")
    ]
    for url in urls:
        assert bob.client.get(url).status_code == 404, url
        anonymous = Client().get(url)
        assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("login")), url


def test_it_streams_under_asgi_one_chunk_at_a_time():
    from django.core.handlers.asgi import ASGIRequest

    pulled = []

    def chunks():
        for i in range(3):
            pulled.append(i)
            yield f"{i}\n"

    scope = {"type": "http", "method": "GET", "path": "/", "query_string": b"", "headers": []}
    response = streamed(ASGIRequest(scope, io.BytesIO()), chunks(), filename="x.txt", content_type="text/plain")
    assert response.is_async and pulled == []  # nothing is read before the server asks

    async def first_two():
        it = response.streaming_content.__aiter__()
        return [await it.__anext__(), await it.__anext__()]

    from asgiref.sync import async_to_sync

    assert async_to_sync(first_two)() == [b"0\n", b"1\n"] and pulled == [0, 1]


def test_it_zips_large_files_front_to_back(tmp_path):
    (tmp_path / "w").mkdir()
    big = tmp_path / "w" / "model.safetensors"
    big.write_bytes(bytes(range(256)) * 20_000)  # ~5 MB: several chunks
    (tmp_path / "w" / "config.json").write_text('{"a": 1}')
    parts = list(artifacts.zip_folder(tmp_path / "w", root="m"))
    assert len(parts) > 3 and max(len(p) for p in parts) <= artifacts.CHUNK + 1024
    archive = zipfile.ZipFile(io.BytesIO(b"".join(parts)))
    assert archive.read("m/model.safetensors") == big.read_bytes() and archive.getinfo("m/model.safetensors").compress_type == zipfile.ZIP_STORED
