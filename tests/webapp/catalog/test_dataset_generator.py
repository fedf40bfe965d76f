"""Built-in generator datasets: environment + arguments + sizes, with a sample shown."""

from __future__ import annotations

from django.urls import reverse

from webapp.catalog import services as catalog
from webapp.models import Dataset


def test_it_creates_a_generator_dataset_with_a_sample(alice):
    response = alice.client.post(reverse("dataset_generate"), {
        "name": "level 2", "environment": "math_tool", "env_args": '{"level": 2}', "size": "64", "eval_size": "16",
    })
    dataset = Dataset.objects.get(team=alice.team, name="level 2")
    assert response["Location"] == dataset.get_absolute_url()
    assert dataset.kind == "generator" and dataset.split == (64, 16) and dataset.row_count == 80
    assert dataset.preview and dataset.schema
    assert alice.client.get(dataset.get_absolute_url()).status_code == 200


def test_it_shows_bad_generator_arguments_next_to_the_field(alice):
    response = alice.client.post(reverse("dataset_generate"), {
        "name": "bad", "environment": "math_tool", "env_args": '{"level": 99, "colour": "red"}', "size": "8", "eval_size": "0",
    })
    assert response.status_code == 200
    assert "env_args" in response.context["form"].errors
    assert not Dataset.objects.filter(name="bad").exists()


def test_it_edits_a_generator_dataset(alice, alice_world):
    url = reverse("dataset_detail", args=[alice_world.dataset.pk])
    response = alice.client.post(url, {"name": "gen L1", "environment": "math_tool", "env_args": '{"level": 1}',
                                       "size": "100", "eval_size": "10"})
    assert response.status_code == 302
    alice_world.dataset.refresh_from_db()
    assert alice_world.dataset.split == (100, 10)


def test_it_marks_a_dataset_whose_file_vanished_invalid(alice, alice_world):
    d = alice_world.dataset
    d.kind, d.file = Dataset.Kind.UPLOAD, "datasets/1/gone.jsonl"
    d.save()
    assert catalog.dataset_revalidate(dataset=d).status == "invalid"
    assert "missing" in d.status_message
