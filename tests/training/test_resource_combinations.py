"""Resource settings that the engine cannot honour together are refused when the config is
validated, each at the field that asks for it, all in one pass, rather than ignored or failing
later on a worker: vLLM with sharded or placed models, FSDP over a 4-bit base, a one-step-off
sampler in a launch of several processes, and an SFT run asked to shard, place or span hosts.
The combinations that do work pass."""

from __future__ import annotations

import pytest

from tests.training.test_config_problems import problems_of, tree
from training.config import RunConfig

FULL_PLACED = {"topology__specialization": "full", "resources__gpus": 2, "resources__placement": {"tool": 1, "reasoner": 1},
               "optim__tasks_per_step": 2}
FSDP = {"resources__gpus": 2, "resources__parallel": "fsdp", "optim__tasks_per_step": 2}
SFT = {"algorithm": "sft", "sft__path": "chats.jsonl"}


@pytest.mark.parametrize(
    ("settings", "field", "words"),
    [
        ({**FSDP, "generation__backend": "vllm"}, "generation.backend", "resources.parallel fsdp"),
        ({**FULL_PLACED, "generation__backend": "vllm"}, "generation.backend", "resources.placement"),
        ({**FSDP, "model__quantization": "4bit"}, "resources.parallel", "4-bit"),
        ({**FSDP, "generation__async": "one_step_off"}, "generation.async", "several processes"),
        ({"resources__hosts": 2, "optim__tasks_per_step": 2, "generation__async": "one_step_off"}, "generation.async", "resources.hosts > 1"),
        ({**SFT, "resources__hosts": 2}, "resources.hosts", "SFT run"),
        ({**SFT, "resources__parallel": "fsdp"}, "resources.parallel", "SFT run"),
        ({**SFT, "topology__specialization": "full", "resources__placement": {"tool": 1, "reasoner": 1}},
         "resources.placement", "SFT run"),
        ({"resources__placement": {"tool": 1, "reasoner": 1}, "resources__gpus": 2, "optim__tasks_per_step": 2},
         "resources.placement", "`full` specialization"),
        ({**FULL_PLACED, "resources__hosts": 2}, "resources.placement", "several hosts"),
    ],
)
def test_it_refuses_a_combination_that_does_not_work_at_its_field(settings, field, words):
    found = problems_of(tree(**settings))
    assert field in found, found
    assert words in found[field]


def test_it_names_every_refused_combination_at_once():
    found = problems_of(tree(**FSDP, generation__backend="vllm", model__quantization="4bit", generation__async="one_step_off"))
    assert {"generation.backend", "resources.parallel", "generation.async"} <= set(found)
    sft = problems_of(tree(**SFT, resources__hosts=2, resources__parallel="fsdp"))
    assert {"resources.hosts", "resources.parallel"} <= set(sft)


@pytest.mark.parametrize(
    "settings",
    [
        {**FSDP, "generation__backend": "auto"},  # auto picks the HF backend for sharded models
        {**FULL_PLACED, "resources__parallel": "fsdp", "generation__backend": "hf"},
        {"resources__hosts": 2, "resources__parallel": "fsdp", "optim__tasks_per_step": 2},
        {"resources__gpus": 2, "optim__tasks_per_step": 2, "generation__backend": "vllm"},  # data parallel: a whole model per rank
        {"resources__hosts": 2, "optim__tasks_per_step": 2, "generation__backend": "vllm"},
        {"model__quantization": "4bit", "resources__gpus": 2, "optim__tasks_per_step": 2},
        {"generation__async": "one_step_off", "generation__backend": "hf"},
        {"generation__async": "one_step_off", "generation__backend": "vllm"},
    ],
)
def test_the_combinations_that_work_pass(settings):
    RunConfig.from_dict(tree(**settings))
