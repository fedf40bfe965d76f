"""Conversations datasets (for SFT runs): a good file is stored with a preview; a bad one lists every
bad line with its number and leaves nothing behind."""

from __future__ import annotations

import json

from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from webapp.models import Dataset

GOOD = [
    {"messages": [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": "3*7?"},
                  {"role": "assistant", "content": "<tool_call>...</tool_call>"}, {"role": "tool", "content": "21"},
                  {"role": "assistant", "content": "21"}], "agent": "tool"},
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "agent": "reasoner"},
]


def upload(persona, lines):
    content = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()
    return persona.client.post(reverse("dataset_upload_conversations"), {
        "name": "demos", "environment": "math_tool", "file": SimpleUploadedFile("demos.jsonl", content)})


def test_it_stores_a_good_conversations_file_with_a_preview(alice, data_dir):
    response = upload(alice, GOOD)
    dataset = Dataset.objects.get(team=alice.team, name="demos")
    assert response["Location"] == dataset.get_absolute_url()
    assert dataset.kind == Dataset.Kind.CHATS and dataset.row_count == 2 and dataset.status == "valid"
    assert dataset.path.is_file() and dataset.path.is_relative_to(data_dir / "datasets")
    assert dataset.preview[0]["agent"] == "tool" and "tool: 21" in dataset.preview[0]["messages"]
    page = alice.client.get(dataset.get_absolute_url()).content.decode()
    assert "Conversations (SFT)" in page


def test_it_lists_every_bad_line_and_saves_nothing(alice, data_dir):
    response = upload(alice, [GOOD[0], {"messages": [{"role": "robot", "content": "x"}]}, "{oops", {"messages": []}])
    assert response.status_code == 200
    errors = " ".join(response.context["form"].errors["file"])
    assert "line 2:" in errors and "'robot'" in errors and "line 3:" in errors and "line 4:" in errors
    assert not Dataset.objects.filter(team=alice.team).exists()
    stored = [p for p in (data_dir / "datasets").rglob("*") if p.is_file()] if (data_dir / "datasets").exists() else []
    assert stored == []
