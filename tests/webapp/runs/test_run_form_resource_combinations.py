"""The run form refuses resource combinations the engine cannot honour (training.config's
`_launch_problems`, tested field by field in tests/training/test_resource_combinations.py), each
next to the field that asks for it, all at once, and saves nothing."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.runs.test_run_form import _data
from webapp.models import Run


def test_it_refuses_vllm_with_sharded_models_and_a_sharded_4bit_base_at_once(alice, alice_world, enqueued):
    yaml = "resources: {parallel: fsdp}\ngeneration: {backend: vllm}\nmodel: {quantization: 4bit}\n"
    response = alice.client.post(reverse("run_new"), _data(alice_world, gpus="2", tasks_per_step="2", advanced_yaml=yaml))
    errors = " ".join(response.context["form"].errors.get("advanced_yaml", []))
    assert "generation.backend: vllm serves each model whole" in errors and "resources.parallel fsdp" in errors
    assert "resources.parallel: fsdp cannot shard a 4-bit (bitsandbytes) base" in errors
    assert Run.objects.count() == 1 and enqueued == []
