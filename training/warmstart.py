"""Start a run from another run's weights (`model.init_from`): a warm start.

Each policy of the new run loads one policy folder of the source checkpoint, as `save_policies`
wrote it: a LoRA adapter into an adapter (`lora` from `lora`), a full model into a full model or
the shared model (`full`, `single`, `prompt` from any of them). Optimizer state, RNG and data
order start fresh; that is what tells a warm start from a resume (`checkpoint.resume_from`).

The engine trusts the folder it is given; on the web, `webapp.core.trust` lets a team name only
its own runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from training.config import ConfigError, RunConfig
from training.policies import PolicySet, load_policy_folder

STATE_FILE = "trainer_state.pt"  # training.trainer.STATE_FILE (the trainer imports this module)


@dataclass(frozen=True)
class WarmStart:
    checkpoint: Path
    """The source checkpoint folder."""
    step: int
    """Its step."""
    loaded: dict[str, str]
    """This run's policy -> the source folder it loaded."""


def checkpoint_folder(run: str | Path, step: int = 0) -> Path:
    """The checkpoint folder of `run` (a run's output folder, or a checkpoint folder itself) at
    `step` (0: its last); FileNotFoundError naming what is missing."""
    root = Path(run)
    if (root / STATE_FILE).is_file():
        if step and _step_of(root) != step:
            raise FileNotFoundError(f"{root} is the checkpoint of step {_step_of(root)}, not {step}")
        return root
    folder = root / "checkpoints"
    kept = sorted(p for p in folder.glob("step-*") if p.is_dir() and (p / STATE_FILE).is_file())
    if not kept:
        raise FileNotFoundError(f"{root} holds no checkpoint (no {folder}/step-*/{STATE_FILE})")
    if not step:
        return kept[-1]
    chosen = folder / f"step-{step:06d}"
    if chosen not in kept:
        raise FileNotFoundError(f"{root} has no checkpoint at step {step}; it keeps steps {', '.join(str(_step_of(p)) for p in kept)}")
    return chosen


def _step_of(folder: Path) -> int:
    return int(folder.name.removeprefix("step-")) if folder.name.startswith("step-") else 0


def source_config(checkpoint: Path) -> RunConfig | None:
    """The config the source checkpoint was saved with (None for one saved before configs were)."""
    state = torch.load(checkpoint / STATE_FILE, weights_only=False, map_location="cpu")
    text = state.get("config")
    return RunConfig.from_yaml(text) if text else None


def init_from(config: RunConfig, policies: PolicySet) -> WarmStart | None:
    """Load `model.init_from` into the built policies; None when the config names no source.
    ConfigError (naming `model.init_from...`) when a folder is missing or holds the wrong kind of
    weights (an adapter where a model is needed, or an adapter trained on another base)."""
    init = config.model.init_from
    if not init.run:
        return None
    try:
        folder = checkpoint_folder(init.run, init.step)
    except FileNotFoundError as exc:
        raise ConfigError("model.init_from.run", str(exc)) from None
    for mine in init.agents:
        if mine not in policies.policies:
            raise ConfigError(f"model.init_from.agents.{mine}", f"this run has no policy {mine!r}; its policies: {', '.join(policies.policies)}")
    source = source_config(folder)
    loaded = {}
    for name, pol in policies.policies.items():
        theirs = init.agents.get(name, name)
        where = f"model.init_from.agents.{name}" if name in init.agents else "model.init_from.run"
        src = folder / theirs
        if not src.is_dir():
            have = ", ".join(sorted(p.name for p in folder.iterdir() if p.is_dir())) or "none"
            raise ConfigError(where, f"{folder} has no folder {theirs!r} for policy {name!r} (it has: {have}); map it in model.init_from.agents")
        adapter = (src / "adapter_model.safetensors").is_file()
        if pol.adapter is not None and not adapter:
            raise ConfigError(where, f"{src} holds a whole model, and a `lora` policy starts from an adapter: use it as model.source instead")
        if pol.adapter is None and adapter:
            raise ConfigError(where, f"{src} holds a LoRA adapter: merge it into its base first (python -m training export) and use that as model.source")
        if adapter and source is not None and source.model.source != config.model.source:
            raise ConfigError(where, f"the adapter {src} was trained on {source.model.source}, this run's base is {config.model.source}")
        if adapter and source is not None:
            for field in ("r", "alpha", "target_modules"):  # the adapter's shape and scale: loaded otherwise, a torch size error
                theirs_v, mine_v = _show(getattr(source.lora, field)), _show(getattr(config.lora, field))
                if theirs_v != mine_v:
                    raise ConfigError(where, f"the adapter {src} has lora.{field} {theirs_v}, this run's is {mine_v}: "
                                             f"set lora.{field}: {theirs_v} to start from it")
        load_policy_folder(pol, src)
        if config.grpo.beta > 0 and pol.trainable:
            pol.pin_reference()  # the KL is to the policy the run starts from, not the base before the warm start
        loaded[name] = theirs
    return WarmStart(folder, _step_of(folder), loaded)


def _show(value: object) -> str:
    return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, (list, tuple)) else str(value)
