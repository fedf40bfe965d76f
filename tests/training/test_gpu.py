"""The engine on CUDA: bf16 weights, the HF backend's update and sampling on the GPU, a QLoRA
base, agents on different GPUs, and data-parallel training over NCCL. Skipped without CUDA (and,
for each test, without what it needs: bitsandbytes, two GPUs)."""

from pathlib import Path

import pytest
import torch

from training.config import RunConfig
from training.events import NullSink
from training.models import load_model
from training.policies import build_policies
from training.trainer import train

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def tiny(**overrides) -> RunConfig:
    base = {"generation.backend": "hf", "optim.steps": 2, "checkpoint.every": 0, "eval.every": 2, "data.train_size": 16}
    return RunConfig.load(ROOT / "configs/tiny-lora.yaml").replace(**{**base, **overrides})


def test_weights_are_bfloat16_on_the_gpu_by_default():
    model, _ = load_model("tiny-random:llama", device="cuda")
    assert next(model.parameters()).dtype == torch.bfloat16 and next(model.parameters()).is_cuda


@pytest.mark.parametrize("specialization", ["lora", "prompt", "full"])
def test_a_run_trains_on_the_gpu_with_the_hf_backend(tmp_path, specialization):
    result = train(tiny(**{"topology.specialization": specialization}), out_dir=tmp_path, sink=NullSink())
    assert result.status == "succeeded" and result.step == 2
    assert result.final_metrics["tokens_per_s"] > 0


def test_a_qlora_base_is_4bit_and_only_the_adapters_train(tmp_path):
    pytest.importorskip("bitsandbytes")
    config = tiny(**{"model.quantization": "4bit", "model.gradient_checkpointing": True})
    policies = build_policies(config)
    tool = policies.for_agent("tool")
    quantized = [m for m in tool.model.modules() if type(m).__name__ == "Linear4bit"]
    assert quantized, "no 4-bit linear layers in the base"
    assert all("lora_" in n for n, p in tool.model.named_parameters() if p.requires_grad)
    result = train(config, out_dir=tmp_path, sink=NullSink())
    assert result.status == "succeeded"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_agents_models_sit_on_their_own_gpus():
    config = tiny(**{"topology.specialization": "full", "resources.gpus": 2, "resources.parallel": "agents"})
    policies = build_policies(config)
    devices = {name: next(p.model.parameters()).device.index for name, p in policies.policies.items()}
    assert devices == {"tool": 0, "reasoner": 1}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_two_gpu_data_parallel_run_trains_over_nccl(tmp_path):
    result = train(tiny(**{"resources.gpus": 2, "optim.tasks_per_step": 4}), out_dir=tmp_path, sink=NullSink())
    assert result.status == "succeeded" and result.step == 2
