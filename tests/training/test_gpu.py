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
from training.runner import train

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


def _update_peak_mib(config: RunConfig) -> tuple[float, float]:
    """(peak CUDA memory of one update above what was allocated before it, the update's grad norm)."""
    from training.update import Sample, update_policy

    policy = build_policies(config).for_agent("tool")
    gen = torch.Generator().manual_seed(0)
    samples = []
    for g in range(2):
        prompt = tuple(torch.randint(0, 250, (512,), generator=gen).tolist())
        samples += [Sample("tool", prompt, tuple(torch.randint(0, 250, (256,), generator=gen).tolist()), advantage=(-1.0) ** i + 0.1 * g)
                    for i in range(4)]
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    stats = update_policy(policy, samples, config, step=1)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20, stats["grad_norm"]


def test_gradient_checkpointing_lowers_the_updates_peak_memory_on_the_gpu():
    config = tiny(**{"topology.specialization": "full", "optim.micro_batch_size": 8, "optim.micro_batch_tokens": 8192})
    plain, plain_norm = _update_peak_mib(config)
    ckpt, ckpt_norm = _update_peak_mib(config.replace(**{"model.gradient_checkpointing": True}))
    assert ckpt < plain, (ckpt, plain)
    assert ckpt_norm == pytest.approx(plain_norm, rel=1e-2)  # bfloat16
