"""`training.export.merge_adapter` and `python -m training export`: an agent's LoRA adapter merged
into its base is a standalone model that computes what base + adapter computed, saved in the
dtype asked for, with a record of where it came from; a failed export leaves the old one whole."""

from __future__ import annotations

import json

import pytest
import torch

from tests.training.conftest import TINY_LORA
from training.__main__ import main
from training.export import export_dtype, merge_adapter


def test_it_merges_an_adapter_into_a_model_that_computes_the_same(lora_checkpoint, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from training.models import load_model

    config, checkpoint = lora_checkpoint
    export = merge_adapter(config, agent="tool", adapter=checkpoint / "tool", out=tmp_path / "merged", dtype="trained",
                           about={"run": 7})
    assert export.dtype == "float32" and {"config.json", "model.safetensors", "tokenizer.json", "troupe.json"} <= set(export.files)
    assert json.loads((export.folder / "troupe.json").read_text()) == {"run": 7, "agent": "tool", "base_model": "tiny-random:llama",
                                                                       "dtype": "float32"}
    merged = AutoModelForCausalLM.from_pretrained(export.folder).eval()
    assert not any("lora" in name for name, _ in merged.named_parameters())
    base, _ = load_model("tiny-random:llama")
    with_adapter = PeftModel.from_pretrained(base, str(checkpoint / "tool")).eval()
    ids = torch.tensor([[1, 5, 9, 13, 17]])  # (1, 5)
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, with_adapter(ids).logits, atol=1e-4)  # (1, 5, vocab)


def test_it_saves_in_bfloat16_or_in_the_dtype_the_run_trained_in(lora_checkpoint, monkeypatch):
    config, _ = lora_checkpoint
    assert export_dtype(config, "bfloat16") == torch.bfloat16
    assert export_dtype(config, "trained") == torch.float32  # auto, on a host without CUDA
    assert export_dtype(config.replace(**{"model.dtype": "float16"}), "trained") == torch.float16
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert export_dtype(config, "trained") == torch.bfloat16  # auto trains in bf16 on a GPU
    with pytest.raises(ValueError, match="allowed: bfloat16, trained"):
        export_dtype(config, "int8")


def test_a_failed_export_leaves_the_previous_one_whole(lora_checkpoint, tmp_path, monkeypatch):
    from transformers import PreTrainedTokenizerBase

    config, checkpoint = lora_checkpoint
    first = merge_adapter(config, agent="reasoner", adapter=checkpoint / "reasoner", out=tmp_path / "merged")
    assert first.dtype == "bfloat16"

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full_disk)
    with pytest.raises(OSError):
        merge_adapter(config, agent="reasoner", adapter=checkpoint / "reasoner", out=tmp_path / "merged")
    assert sorted(p.name for p in (tmp_path / "merged").iterdir()) == first.files


def test_it_refuses_an_unknown_agent_or_a_folder_without_an_adapter(lora_checkpoint, tmp_path):
    config, checkpoint = lora_checkpoint
    with pytest.raises(ValueError, match="no agent 'critic'; its agents are tool, reasoner"):
        merge_adapter(config, agent="critic", adapter=checkpoint / "tool", out=tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="not a LoRA adapter folder"):
        merge_adapter(config, agent="tool", adapter=tmp_path, out=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_the_cli_exports_an_agent(lora_checkpoint, tmp_path, capsys):
    _, checkpoint = lora_checkpoint
    out = tmp_path / "tool-merged"
    assert main(["export", str(TINY_LORA), "--checkpoint", str(checkpoint), "--agent", "tool", "--out", str(out)]) == 0
    assert f"merged tool (bfloat16) into {out}: " in capsys.readouterr().out and (out / "model.safetensors").is_file()
    assert main(["export", str(TINY_LORA), "--checkpoint", str(checkpoint), "--agent", "critic", "--out", str(out)]) == 2
    assert "no agent 'critic'" in capsys.readouterr().err
