"""Merged export: one agent's LoRA adapter merged into its base model and saved as a standalone
Hugging Face model folder (safetensors, tokenizer, and `troupe.json` saying where it came from),
which any transformers or vLLM user can load without PEFT.

The merge runs in float32, so the adapter's low-rank update is added to the base weights without
rounding, and the result is cast to the dtype asked for afterwards: `bfloat16` (half the size of
float32, what GPUs serve) or `trained`, the dtype the run trained in (`training.models.trained_dtype`).
The folder is written beside the target and renamed into place, so a failed export never leaves
half a model. Called by the web's merge job (`webapp.jobs.services.merge_execute`) and by
`python -m training export`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.config import RunConfig

EXPORT_DTYPES = ("bfloat16", "trained")
"""How a merged model may be saved: bfloat16, or the dtype the run trained in."""

ABOUT_FILE = "troupe.json"
"""The file in an export that records its run, agent, base model and dtype."""


@dataclass(frozen=True)
class Export:
    folder: Path
    """The merged model's folder."""
    files: list[str]
    """The names of the files in it."""
    dtype: str
    """The dtype its weights are saved in (`bfloat16`, `float32`, `float16`)."""


def export_dtype(config: RunConfig, dtype: str) -> torch.dtype:
    """The torch dtype an export saved `dtype` (one of EXPORT_DTYPES) has for this run's config."""
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"unknown export dtype {dtype!r}; allowed: {', '.join(EXPORT_DTYPES)}")
    from training.models import trained_dtype

    return torch.bfloat16 if dtype == "bfloat16" else trained_dtype(config.model.dtype)


def merge_adapter(
    config: RunConfig, *, agent: str, adapter: str | Path, out: str | Path, dtype: str = "bfloat16",
    about: Mapping[str, Any] | None = None,
) -> Export:
    """Merge `agent`'s LoRA adapter (the folder `adapter`, as a checkpoint holds it) into the
    agent's base model and save the result in `out` (replaced if it exists), in `dtype`
    (EXPORT_DTYPES). `about` adds to what `troupe.json` records (the web adds the run and step)."""
    from peft import PeftModel

    from training.models import load_model

    target = export_dtype(config, dtype)
    try:
        base_source = config.agent_model(config.agent(agent))
    except KeyError:
        raise ValueError(f"the config has no agent {agent!r}; its agents are {', '.join(a.name for a in config.topology.agents)}") from None
    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)")
    base, tokenizer = load_model(base_source, dtype="float32", device="cpu")
    merged = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload().to(target)
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    saved_dtype = str(merged.dtype).removeprefix("torch.")
    record = {**(about or {}), "agent": agent, "base_model": base_source, "dtype": saved_dtype}
    (tmp / ABOUT_FILE).write_text(json.dumps(record, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return Export(folder=out, files=sorted(p.name for p in out.iterdir()), dtype=saved_dtype)
