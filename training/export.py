"""Merged export: one agent's LoRA adapter merged into its base model and saved as a standalone
Hugging Face model folder (safetensors, tokenizer, and `troupe.json` saying where it came from),
which any transformers or vLLM user can load without PEFT.

The merge runs in float32, so the adapter's low-rank update is added to the base weights without
rounding, and the result is cast to the dtype asked for afterwards: `bfloat16` (half the size of
float32, what GPUs serve) or `trained`, the dtype the run trained in (`training.models.trained_dtype`).
The folder is written beside the target and renamed into place, so a failed export never leaves
half a model. Called by the web's merge job (`webapp.jobs.services.merge_execute`) and by
`python -m training export`.

GGUF export (`export_gguf`): the merged model, kept in float32, goes through llama.cpp's own
Hugging Face converter (`convert_hf_to_gguf`'s `conversion` package, as the `convert-hf-to-gguf`
distribution packages it) writing with the `gguf` package, as one `.gguf` file in `f16` or `q8_0`,
with an Ollama `Modelfile` beside it. The converter's list of architectures decides what can be
exported; anything else is refused before any merging starts.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.config import RunConfig
from training.gguf_conversion import GGUF_TYPES, gguf_architecture, gguf_convert

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


def _check_adapter(config: RunConfig, agent: str, adapter: str | Path) -> tuple[str, Path]:
    """(the agent's base model source, its adapter folder), or a clear error for an agent that
    has no mergeable LoRA adapter there."""
    try:
        base_source = config.agent_model(config.agent(agent))
    except KeyError:
        raise ValueError(f"the config has no agent {agent!r}; its agents are {', '.join(a.name for a in config.topology.agents)}") from None
    adapter = Path(adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(f"{adapter} is not a LoRA adapter folder (no adapter_config.json)")
    return base_source, adapter


def _merged(base_source: str, adapter: Path) -> tuple[Any, Any]:
    """The base model with the adapter merged in, in float32 on the CPU, and its tokenizer."""
    from peft import PeftModel

    from training.models import load_model

    base, tokenizer = load_model(base_source, dtype="float32", device="cpu")
    return PeftModel.from_pretrained(base, str(adapter)).merge_and_unload(), tokenizer


def merge_adapter(
    config: RunConfig, *, agent: str, adapter: str | Path, out: str | Path, dtype: str = "bfloat16",
    about: Mapping[str, Any] | None = None,
) -> Export:
    """Merge `agent`'s LoRA adapter (the folder `adapter`, as a checkpoint holds it) into the
    agent's base model and save the result in `out` (replaced if it exists), in `dtype`
    (EXPORT_DTYPES). `about` adds to what `troupe.json` records (the web adds the run and step)."""
    target = export_dtype(config, dtype)
    base_source, adapter = _check_adapter(config, agent, adapter)
    merged, tokenizer = _merged(base_source, adapter)
    merged = merged.to(target)
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


# == GGUF (llama.cpp, Ollama) ==========================================================================

MODELFILE = "Modelfile"
"""The Ollama Modelfile written beside the GGUF file (`ollama create NAME -f Modelfile`)."""


@dataclass(frozen=True)
class GgufExport:
    folder: Path
    """The export's folder: the `.gguf` file, the Modelfile and `troupe.json`."""
    file: Path
    """The `.gguf` file."""
    files: list[str]
    """The names of the files in the folder."""
    gguf_type: str
    """`f16` or `q8_0` (GGUF_TYPES)."""
    architecture: str
    """The Hugging Face architecture the converter read (`LlamaForCausalLM`, ...)."""


def _modelfile(gguf_file: str, tokenizer: Any, about: Mapping[str, Any]) -> str:
    lines = [
        f"# Ollama: `ollama create {_slug(str(about.get('agent', 'agent')))} -f {MODELFILE}` in this folder.",
        f"# {about.get('agent')} from Troupe (base {about.get('base_model')}); Ollama reads the chat template",
        "# from the GGUF file (tokenizer.chat_template).",
        f"FROM ./{gguf_file}",
    ]
    for token in dict.fromkeys(t for t in (getattr(tokenizer, "eos_token", None),) if t):
        lines.append(f"PARAMETER stop {json.dumps(token)}")
    return "\n".join(lines) + "\n"


def _slug(name: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "agent"


def export_gguf(
    config: RunConfig, *, agent: str, adapter: str | Path, out: str | Path, gguf_type: str = "q8_0",
    about: Mapping[str, Any] | None = None,
) -> GgufExport:
    """Merge `agent`'s LoRA adapter into its base model (float32) and write it as one GGUF file of
    `gguf_type` (GGUF_TYPES) with an Ollama Modelfile and `troupe.json` in `out` (replaced if it
    exists). An agent with no adapter or a base architecture the converter does not know is refused
    before anything is merged; everything is written beside `out` and renamed into place, so a
    failure leaves no half-written export."""
    from training.models import resolve_model_dir

    if gguf_type not in GGUF_TYPES:
        raise ValueError(f"unknown GGUF type {gguf_type!r}; allowed: {', '.join(GGUF_TYPES)}")
    base_source, adapter = _check_adapter(config, agent, adapter)
    architecture = gguf_architecture(resolve_model_dir(base_source))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        merged, tokenizer = _merged(base_source, adapter)
        with tempfile.TemporaryDirectory(dir=tmp, prefix="merged-") as hf:
            merged.save_pretrained(hf, safe_serialization=True)
            tokenizer.save_pretrained(hf)
            del merged
            file_name = f"{_slug(agent)}-{gguf_type}.gguf"
            gguf_convert(hf, tmp / file_name, gguf_type=gguf_type, name=agent)
        record = {**(about or {}), "agent": agent, "base_model": base_source, "format": "gguf",
                  "gguf_type": gguf_type, "architecture": architecture, "file": file_name}
        (tmp / MODELFILE).write_text(_modelfile(file_name, tokenizer, record))
        (tmp / ABOUT_FILE).write_text(json.dumps(record, indent=2))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return GgufExport(folder=out, file=out / file_name, files=sorted(p.name for p in out.iterdir()),
                      gguf_type=gguf_type, architecture=architecture)
