"""Several hosts: a data-parallel run on the operator's Ray cluster, through Ray Train.

A run with `resources.hosts: N > 1` calls `train` as usual; `train` sees that it is not inside a
launch and calls `launch`, which connects to the cluster named by TROUPE_RAY_ADDRESS and runs
`training.rank.run_rank` (the entry torchrun starts on one host) on `hosts * gpus` Ray Train
workers. Ray Train's `TorchTrainer` does what a multi-host launch needs and Troupe writes none of
it: one placement group holding every rank's GPU (or CPU) at once or none, the rendezvous and
`torch.distributed`'s process group (NCCL on GPUs, gloo on CPUs), RANK/WORLD_SIZE/LOCAL_RANK for
`training.distributed.from_env`, and a run that fails as a whole when a rank or a host dies.

The events travel as they do under torchrun, through a mailbox instead of a file: a small Ray
actor (`RunRelay`) on the launching process's node. Rank 0's sink (`ActorRelaySink`) puts each
event in it and asks it whether to stop; the launcher takes the events every `poll_s` seconds and
replays them to its own sink (the web worker's database sink), and when that sink asks to stop
it tells the mailbox, so rank 0 stops at its next step and every rank with it.

Nothing here knows about Django, and nothing imports Ray until a run asks for several hosts.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import signal
import sys
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.config import RunConfig
from training.distributed import COLLECTIVE_TIMEOUT, DistributedRunError, RelaySink, replay
from training.events import EventSink, TrainResult

RAY_ADDRESS_ENV = "TROUPE_RAY_ADDRESS"
FORWARDED_ENV_PREFIXES = ("TROUPE_", "HF_", "TRANSFORMERS_")
"""The launching worker's environment variables the ranks get too (plugins, model caches)."""


def no_cluster_message(hosts: int) -> str:
    """Why a run on several hosts cannot start here (the web's refusal and the engine's say the same)."""
    return (f"the run asks for {hosts} hosts, and this installation names no Ray cluster: the operator sets "
            f"{RAY_ADDRESS_ENV} (e.g. ray://head:10001 or head:6379) on the worker; otherwise use resources.hosts: 1")


# == the mailbox (a Ray actor on the launcher's node) =============================================


class RunRelay:
    """Rank 0's events on their way to the launcher, and the launcher's stop request on its way
    to rank 0. A plain class: `launch` makes it a Ray actor, the tests call it directly."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.stop = False

    def put(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def take(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events

    def request_stop(self) -> None:
        self.stop = True

    def stop_requested(self) -> bool:
        return self.stop


Call = Callable[..., Any]
"""How a method of the mailbox is called: `ray_call` on a Ray actor, a plain call in the tests."""


def ray_call(method: Any, *args: Any) -> Any:
    """Call an actor's method and wait for its answer (so events arrive in order and a rank's last
    words, its result or error, are delivered before it exits)."""
    import ray

    return ray.get(method.remote(*args))


def plain_call(method: Any, *args: Any) -> Any:
    return method(*args)


class ActorRelaySink(RelaySink):
    """Rank 0's sink on a Ray worker: the events of `RelaySink`, put in the mailbox."""

    def __init__(self, relay: Any, *, call: Call = ray_call):
        self.relay, self.call = relay, call

    def _write(self, event: dict[str, Any]) -> None:
        self.call(self.relay.put, event)

    def should_stop(self) -> bool:
        return bool(self.call(self.relay.stop_requested))


# == the launcher's side ===========================================================================


@dataclass
class Outcome:
    """What rank 0 reported at its end: the `result` event or the `error` event (or neither, when
    it never got that far)."""

    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


def relay_events(relay: Any, sink: EventSink, outcome: Outcome, *, call: Call = ray_call) -> None:
    """Replay the events waiting in the mailbox to `sink`, keep rank 0's result or error in
    `outcome`, and pass `sink`'s stop request on to the mailbox."""
    for event in call(relay.take):
        if event["type"] == "result":
            outcome.result = event
        elif event["type"] == "error":
            outcome.error = event
        else:
            replay(event, sink)
    if sink.should_stop():
        call(relay.request_stop)


def result_of(outcome: Outcome, failure: BaseException | None, *, ranks: int) -> TrainResult:
    """The run's `TrainResult`, or the `DistributedRunError` that says why there is none: rank 0's
    own error first (it names the failing line), else what Ray Train reported (a rank or a host
    that died), else a launch that ended without a word."""
    if outcome.error is not None and not (failure is not None and _lost_peer(outcome.error["message"])):
        raise DistributedRunError(f"{outcome.error['message']}\n\nrank 0 traceback:\n{outcome.error['traceback']}")
    if outcome.error is not None:  # rank 0 only saw a peer go: the dead rank or host is the reason
        raise DistributedRunError(f"a rank of the {ranks}-rank Ray run failed; resume from the last checkpoint. "
                                  f"Ray Train said: {_first_lines(str(failure))}\n\nrank 0 saw: {_first_lines(outcome.error['message'], 2, 400)}")
    if failure is not None:
        raise DistributedRunError(f"a rank of the {ranks}-rank Ray run failed; resume from the last checkpoint. "
                                  f"Ray Train said: {_first_lines(str(failure))}") from failure
    if outcome.result is None:
        raise DistributedRunError(f"the {ranks}-rank Ray run ended without rank 0's result")
    return TrainResult(**{k: v for k, v in outcome.result.items() if k != "type"})


LOST_PEER = re.compile(r"(?i)gloo|nccl|connection (?:closed|reset|refused)|broken pipe|DistBackendError|timed out waiting")
"""What a collective says on rank 0 when another rank or its host went away mid-step: then rank 0's
error is a symptom, and Ray Train's report of the dead rank is the run's reason."""


def _lost_peer(message: str) -> bool:
    return bool(LOST_PEER.search(message))


def _first_lines(text: str, lines: int = 6, chars: int = 1500) -> str:
    return "\n".join(text.strip().splitlines()[:lines])[:chars]


def scaling_kwargs(config: RunConfig, *, cluster_gpus: float) -> dict[str, Any]:
    """Ray Train's `ScalingConfig` for `config`: `gpus` ranks per host on `hosts` hosts, one GPU
    each on a cluster with GPUs, else one CPU each. PACK: the placement group fills a host before
    the next (ranks that share a host talk over its own links); it is granted whole or not at all."""
    use_gpu = cluster_gpus > 0
    return {
        "num_workers": config.resources.hosts * config.resources.gpus,
        "use_gpu": use_gpu,
        "resources_per_worker": {"GPU": 1} if use_gpu else {"CPU": 1},
        "placement_strategy": "PACK",
    }


def forwarded_env(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k.startswith(FORWARDED_ENV_PREFIXES) and k != RAY_ADDRESS_ENV}


def launch(config: RunConfig, out: Path, sink: EventSink, *, address: str | None = None, poll_s: float = 0.5) -> TrainResult:
    """Run `config` on `resources.hosts` hosts of the Ray cluster at `address` (default:
    TROUPE_RAY_ADDRESS) and relay rank 0's events to `sink`; return the `TrainResult` rank 0
    reported. Raises `DistributedRunError` when there is no cluster or the run fails (a rank's
    error, or a rank or host that died). `out` must be a folder every host reads and writes at the
    same path (a shared filesystem): rank 0 writes the checkpoints there and a resume reads them."""
    address = address or os.environ.get(RAY_ADDRESS_ENV, "")
    if not address:
        raise DistributedRunError(f"resources.hosts: {no_cluster_message(config.resources.hosts)}")
    import ray
    from ray.train import FailureConfig, ScalingConfig
    from ray.train import RunConfig as RayRunConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not ray.is_initialized():
        on_sigterm = signal.getsignal(signal.SIGTERM)
        with contextlib.redirect_stdout(sys.__stdout__), contextlib.redirect_stderr(sys.__stderr__):  # Celery's stand-ins have no fileno
            ray.init(address=address, log_to_driver=False)
        if threading.current_thread() is threading.main_thread():  # Ray's handler exits at once: keep the worker's warm shutdown
            signal.signal(signal.SIGTERM, on_sigterm)
    out.mkdir(parents=True, exist_ok=True)
    here = ray.get_runtime_context().get_node_id()
    on_this_node = NodeAffinitySchedulingStrategy(node_id=here, soft=False)
    relay = ray.remote(num_cpus=0, scheduling_strategy=on_this_node)(RunRelay).remote()  # type: ignore[call-overload]  # Ray's stub omits node affinity
    cluster_gpus = float(ray.cluster_resources().get("GPU", 0))
    scaling = scaling_kwargs(config, cluster_gpus=cluster_gpus)
    ranks = scaling["num_workers"]
    trainer = TorchTrainer(
        _rank_loop,
        train_loop_config={"config": config.to_yaml(), "out": str(out), "relay": relay},
        scaling_config=ScalingConfig(**scaling),
        torch_config=TorchConfig(backend="nccl" if scaling["use_gpu"] else "gloo", timeout_s=int(COLLECTIVE_TIMEOUT.total_seconds())),
        run_config=RayRunConfig(
            name=f"troupe-{out.name}-{uuid.uuid4().hex[:6]}", storage_path=str(out / "ray"),
            failure_config=FailureConfig(max_failures=0),  # a failed run is resumed from Troupe's checkpoint, by a person
            worker_runtime_env={"env_vars": forwarded_env(os.environ)},
        ),  # type: ignore[call-arg]  # Ray Train v2's RunConfig (what `ray.train` gives at run time); the stub is v1's
    )
    sink.log(f"submitting {ranks} ranks ({config.resources.hosts} hosts x {config.resources.gpus} "
             f"{'GPUs' if scaling['use_gpu'] else 'CPU processes'}) to the Ray cluster at {address}")
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # noqa: BLE001 (handed to the launcher's thread)
            failure.append(exc)

    thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)  # Ray Train's SIGINT handler only in the main thread
    thread.start()
    outcome = Outcome()
    try:
        while thread.is_alive():
            relay_events(relay, sink, outcome)
            thread.join(poll_s)
        relay_events(relay, sink, outcome)
    except BaseException:  # the worker is stopping: ask every rank to stop too
        ray_call(relay.request_stop)
        raise
    ray.kill(relay)
    return result_of(outcome, failure[0] if failure else None, ranks=ranks)


# == on every Ray Train worker ======================================================================


def _rank_loop(loop_config: dict[str, Any]) -> None:
    """Ray Train's training function: the rank entry torchrun runs, with the mailbox as rank 0's sink.
    `training.rank` is found by name, as torchrun's `-m training.rank` is: it imports the trainer,
    which imports this module."""
    run_rank = importlib.import_module("training.rank").run_rank
    run_rank(RunConfig.from_yaml(loop_config["config"]), Path(loop_config["out"]), ActorRelaySink(loop_config["relay"]))
