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

Before it submits, the launcher makes sure the cluster can hold the run (`admit`): a run that asks
for more GPUs (or CPUs) or more hosts than the cluster has, and can ever have (no autoscaler that
could add them), is refused at once with what the cluster has; otherwise the launcher reserves the
run's ranks in a placement group of its own and waits for Ray to grant it, saying on the run page
what it waits for ("waiting" phase), asking its sink whether to stop twice a second (a cancel
removes the reservation and ends the run cancelled, before any rank started), and failing the run
after TROUPE_RAY_PLACEMENT_WAIT_S seconds (`DEFAULT_PLACEMENT_WAIT_S`). Once granted, the
reservation is handed back and Ray Train asks for the same bundles at once; the nodes Ray granted
are reported to the sink (`placed`), which the web shows on the run and workers pages. Should
another job take the freed resources in between, Ray Train waits for them up to its own
RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S (60 s by default) and the run then fails with Ray's reason
(`controller_failure_limit=0`: no endless retries a cancel could not reach).

Nothing here knows about Django, and nothing imports Ray until a run asks for several hosts.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from training.config import RunConfig
from training.distributed import COLLECTIVE_TIMEOUT, HEARTBEATS, DistributedRunError, RelaySink, replay
from training.events import EventSink, TrainResult
from training.watchdog import silent_heartbeats, silent_limit, stop_grace

RAY_ADDRESS_ENV = "TROUPE_RAY_ADDRESS"
FORWARDED_ENV_PREFIXES = ("TROUPE_", "HF_", "TRANSFORMERS_")
"""The launching worker's environment variables the ranks get too (plugins, model caches)."""
PLACEMENT_WAIT_ENV = "TROUPE_RAY_PLACEMENT_WAIT_S"
DEFAULT_PLACEMENT_WAIT_S = 900.0
"""How long a run waits for the Ray cluster to grant all its ranks' GPUs (or CPUs) before it fails,
unless the operator sets TROUPE_RAY_PLACEMENT_WAIT_S: 15 minutes, so a busy cluster does not hold
the worker's `ray` queue for ever. A cancel ends the wait at once."""


def no_cluster_message(hosts: int) -> str:
    """Why a run on several hosts cannot start here (the web's refusal and the engine's say the same)."""
    return (f"the run asks for {hosts} hosts, and this installation names no Ray cluster: the operator sets "
            f"{RAY_ADDRESS_ENV} (e.g. ray://head:10001 or head:6379) on the worker; otherwise use resources.hosts: 1")


def placement_wait_s(environ: Mapping[str, str]) -> float:
    """TROUPE_RAY_PLACEMENT_WAIT_S, or `DEFAULT_PLACEMENT_WAIT_S` when unset; a value that is not a
    positive number of seconds fails the run with the variable's name."""
    raw = environ.get(PLACEMENT_WAIT_ENV, "").strip()
    if not raw:
        return DEFAULT_PLACEMENT_WAIT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise DistributedRunError(f"{PLACEMENT_WAIT_ENV}={raw!r} on the worker is not a positive number of seconds")
    return seconds


# == admission: can the cluster hold the run, and when does it grant it ===========================


@dataclass(frozen=True)
class Node:
    id: str
    name: str
    """The node's host name, with the start of its id when two nodes share a host."""
    resources: dict[str, float]
    """Everything the node has (not what is free now): `GPU`, `CPU`, ..."""


@dataclass(frozen=True)
class Cluster:
    """What the Ray cluster can offer a run: its live nodes, and the most of each resource an
    autoscaler could bring (None: the cluster does not grow, it is what `nodes` says)."""

    nodes: list[Node]
    most: dict[str, float] | None = None

    def total(self, resource: str) -> float:
        return sum(n.resources.get(resource, 0.0) for n in self.nodes)


def read_cluster() -> Cluster:
    """The connected cluster's live nodes and, where an autoscaler is configured, its upper bound
    (the same private call Ray Train makes before it waits for a placement group)."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    hosts = [str(n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "?") for n in alive]
    nodes = [Node(id=str(n["NodeID"]), resources={k: float(v) for k, v in (n.get("Resources") or {}).items()},
                  name=host if hosts.count(host) == 1 else f"{host} ({str(n['NodeID'])[:8]})")
             for n, host in zip(alive, hosts)]
    try:
        from ray._private.state import state

        most = state.get_max_resources_from_cluster_config()
    except Exception:  # noqa: BLE001 (a private call: without it the live nodes are the bound)
        most = None
    return Cluster(nodes, {k: float(v) for k, v in most.items()} if most else None)


def unsatisfiable(config: RunConfig, cluster: Cluster, *, resource: str, address: str) -> str | None:
    """Why `cluster` can never hold the run's ranks (one `resource` each: GPU or CPU), or None.
    With an autoscaler only its bound counts; without one, the live nodes must have enough of the
    resource in all and `hosts` of them must have some."""
    r = config.resources
    ranks, what = r.hosts * r.gpus, ("GPUs" if resource == "GPU" else "CPUs")
    ask = f"the run needs {ranks} {what} ({r.hosts} hosts x {r.gpus})"
    fix = "ask for fewer (resources.hosts, resources.gpus), or add nodes to the cluster"
    if cluster.most is not None:
        most = int(cluster.most.get(resource, 0))
        return None if ranks <= most else f"resources.hosts: {ask}, and the Ray cluster at {address} can grow to {most} {what} at most: {fix}"
    able = [n for n in cluster.nodes if n.resources.get(resource, 0.0) >= 1]
    have = int(sum(n.resources.get(resource, 0.0) for n in able))
    if have < ranks:
        return (f"resources.hosts: {ask}, and the Ray cluster at {address} has {have} {what} on "
                f"{len(able)} node{'s' if len(able) != 1 else ''}: it can never start; {fix}")
    if len(able) < r.hosts:
        return (f"resources.hosts: the run asks for {r.hosts} hosts, and the Ray cluster at {address} has "
                f"{len(able)} node{'s' if len(able) != 1 else ''} with {what} ({', '.join(n.name for n in able) or 'none'}): {fix}")
    return None


class Reservation(Protocol):
    """The run's ranks reserved as one placement group (`RayReservation`; a fake in the tests)."""

    def wait(self, timeout_s: float) -> bool:
        """Whether Ray granted every bundle, waiting at most `timeout_s`."""
        ...

    def nodes(self) -> list[str]:
        """The ids of the nodes holding the bundles (once granted), in bundle order."""
        ...

    def remove(self) -> None: ...


class RayReservation:
    """A placement group of `scaling`'s bundles (one per rank) and strategy, as Ray Train will ask for."""

    def __init__(self, scaling: dict[str, Any], name: str):
        from ray.util.placement_group import placement_group

        self.pg = placement_group([scaling["resources_per_worker"]] * scaling["num_workers"],
                                  strategy=scaling["placement_strategy"], name=name)

    def wait(self, timeout_s: float) -> bool:
        return bool(self.pg.wait(timeout_s))

    def nodes(self) -> list[str]:
        from ray.util.placement_group import placement_group_table

        bundles = placement_group_table(self.pg).get("bundles_to_node_id") or {}
        return [str(bundles[i]) for i in sorted(bundles)]

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.pg)


@dataclass
class Admission:
    """What `admit` found: the nodes Ray granted the run (in rank order; empty when it was cancelled
    while waiting) and how long it waited."""

    nodes: list[str] = field(default_factory=list)
    waited_s: float = 0.0
    cancelled: bool = False


HELD_AFTER_S = 5.0
"""A placement group not granted after this long is held up by other work; before it, Ray may
simply not have answered yet (the first waiting line claims nothing)."""


def waiting_line(config: RunConfig, *, resource: str, waited_s: float, wait_s: float) -> str:
    """The run page's sentence while the cluster has not granted the run's ranks yet."""
    r = config.resources
    what = "GPUs" if resource == "GPU" else "CPUs"
    held = ", other work holds them" if waited_s >= HELD_AFTER_S else ""
    return (f"Waiting for {r.hosts} hosts' {what} on the Ray cluster ({r.hosts * r.gpus} ranks x 1 {what[:-1]}, "
            f"all at once): {waited_s:.0f} s so far{held}; it gives up after {wait_s:.0f} s")


def starting_line(where: dict[str, Any]) -> str:
    """The run page's sentence from the grant until rank 0's first word (Ray Train starts a process
    per rank and joins them, which takes seconds to minutes on a loaded cluster)."""
    nodes = where.get("nodes") or {}
    on = ", ".join(f"{n} on {node}" for node, n in nodes.items())
    backend = "NCCL" if where.get("resource") == "GPU" else "gloo"
    return (f"Starting {where.get('ranks')} ranks on {len(nodes)} Ray node{'s' if len(nodes) != 1 else ''} ({on}): "
            f"Ray Train starts a process per rank and joins them over {backend}; then the ranks load the models")


def report_placed(sink: EventSink, where: dict[str, Any]) -> None:
    """Tell the sink where the run's ranks live (`placed`) and that they are starting."""
    sink.placed(where)
    sink.status("starting", starting_line(where))


def admit(config: RunConfig, sink: EventSink, cluster: Cluster, reserve: Callable[[], Reservation], *, resource: str,
          address: str, wait_s: float, poll_s: float = 0.5, say_every_s: float = 5.0,
          clock: Callable[[], float] = time.monotonic) -> Admission:
    """Refuse a run `cluster` can never hold (`DistributedRunError`, before anything is reserved);
    else reserve its ranks (`reserve`) and wait until Ray grants them, the sink asks to stop (then
    `cancelled`) or `wait_s` has passed (`DistributedRunError`). The reservation is removed in every
    case: Ray Train reserves the same bundles itself right after."""
    problem = unsatisfiable(config, cluster, resource=resource, address=address)
    if problem is not None:
        raise DistributedRunError(problem)
    start, said = clock(), -math.inf
    reservation = reserve()
    try:
        while not reservation.wait(poll_s):
            waited = clock() - start
            if sink.should_stop():
                return Admission(waited_s=waited, cancelled=True)
            if waited >= wait_s:
                raise DistributedRunError(
                    f"resources.hosts: the Ray cluster at {address} did not grant the run's {config.resources.hosts * config.resources.gpus} "
                    f"{'GPUs' if resource == 'GPU' else 'CPUs'} ({config.resources.hosts} hosts x {config.resources.gpus}) within "
                    f"{wait_s:.0f} s ({PLACEMENT_WAIT_ENV}): other work holds them; queue the run again later")
            if waited - said >= say_every_s:
                sink.status("waiting", waiting_line(config, resource=resource, waited_s=waited, wait_s=wait_s))
                said = waited
        return Admission(nodes=reservation.nodes(), waited_s=clock() - start)
    finally:
        reservation.remove()


def placed(config: RunConfig, cluster: Cluster, admission: Admission, *, resource: str, address: str) -> dict[str, Any]:
    """The `placed` event of a granted run: hosts asked, the Ray nodes granted and the ranks on each."""
    names = {n.id: n.name for n in cluster.nodes}
    per_node: dict[str, int] = {}
    for node in admission.nodes:
        per_node[names.get(node, node[:8])] = per_node.get(names.get(node, node[:8]), 0) + 1
    return {"launcher": "ray", "address": address, "hosts": config.resources.hosts, "ranks": config.resources.hosts * config.resources.gpus,
            "resource": resource, "nodes": per_node, "waited_s": round(admission.waited_s, 1)}


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


def relay_events(relay: Any, sink: EventSink, outcome: Outcome, *, call: Call = ray_call) -> bool:
    """Replay the events waiting in the mailbox to `sink`, keep rank 0's result or error in
    `outcome`, and pass `sink`'s stop request on to the mailbox; True when there was one."""
    for event in call(relay.take):
        if event["type"] == "result":
            outcome.result = event
        elif event["type"] == "error":
            outcome.error = event
        else:
            replay(event, sink)
    if sink.should_stop():
        call(relay.request_stop)
        return True
    return False


def result_of(outcome: Outcome, failure: BaseException | None, *, ranks: int) -> TrainResult:
    """The run's `TrainResult`, or the `DistributedRunError` that says why there is none: rank 0's
    own error first (it names the failing line), else what Ray Train reported (a rank or a host
    that died), else a launch that ended without a word."""
    if outcome.error is not None and not (failure is not None and _lost_peer(outcome.error["message"])):
        raise DistributedRunError(f"{outcome.error['message']}\n\nrank 0 traceback:\n{outcome.error['traceback']}")
    if outcome.error is not None:  # rank 0 only saw a peer go: the dead rank or host is the reason
        raise DistributedRunError(f"a rank of the {ranks}-rank Ray run failed; resume from the last checkpoint. "
                                  f"Ray Train said: {ray_reason(str(failure))}\n\nrank 0 saw: {_first_lines(outcome.error['message'], 2, 400)}")
    if failure is not None:
        raise DistributedRunError(f"a rank of the {ranks}-rank Ray run failed; resume from the last checkpoint. "
                                  f"Ray Train said: {ray_reason(str(failure))}") from failure
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


RAY_MEMORY_KILL = re.compile(r"Memory on the node \(IP: (?P<ip>[^,]+), ID: (?P<id>\w+)\) was (?P<used>[\d.]+ ?GB) used / (?P<limit>[\d.]+ ?GB) limit")


RANK_SNIPPET = re.compile(r"(?s)\[Rank (\d+) Error Snippet\]:\n(.*?)(?=\n\[Rank \d+ Error Snippet\]:|\Z)")


def _rank_snippet(rank: str, body: str) -> str:
    """`rank 0 on node 609260ec (192.0.2.2): A worker health check failed`: the node the rank ran
    on (when Ray names it) and its error's line: the snippet's first line, or a traceback's last
    exception line."""
    node, ip = re.search(r"node_id='(\w+)'", body), re.search(r"node_ip='([^']+)'", body)
    lines = [line.strip() for line in body.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"[\w.]*(?:Error|Exception)\b.*:", line)]
    what = (errors[-1] if errors else lines[-1]) if lines and lines[0].startswith("Traceback") else (lines[0] if lines else "?")
    where = f" on node {node.group(1)[:8]}" + (f" ({ip.group(1)})" if ip else "") if node else ""
    return f"rank {rank}{where}: {what[:240].rstrip('.')}"


def ray_reason(text: str) -> str:
    """Ray's report of a failure, short enough for the run page: a kill by Ray's memory monitor
    (a page of object-store counters and advice) as one sentence with the node, its memory, the
    task killed and the host's largest processes then; Ray Train's worker errors as one line per
    failed rank with its node; anything else as its first lines."""
    found = RAY_MEMORY_KILL.search(text)
    if found is None:
        snippets = RANK_SNIPPET.findall(text)
        if snippets:  # Ray Train's WorkerGroupError: each failed rank's error with its worker's repr and traceback
            return f"{text.strip().splitlines()[0]} " + "; ".join(_rank_snippet(rank, body) for rank, body in snippets)
        return _first_lines(text)
    task = re.search(r"task name=([^,\s]+)", text)
    threshold = re.search(r"threshold of \d+B \(([\d.]+%)", text)
    top = text.split("Top 10 memory users:", 1)[1] if "Top 10 memory users:" in text else ""
    users = [f"pid {pid} {gb} GB ({' '.join(Path(w).name if i == 0 else w for i, w in enumerate(cmd.split()[:2]))})"
             for pid, gb, cmd in re.findall(r"(?m)^\s*(\d+)\s+([\d.]+)\s+(\S.*)$", top)[:3]]
    return (f"Ray's memory monitor killed {task.group(1) if task else 'a worker'} on node {found['id'][:8]} ({found['ip']}): "
            f"the host's memory was at {found['used']} of {found['limit']}"
            + (f", over Ray's threshold ({threshold.group(1)})" if threshold else "")
            + (f"; its largest processes then: {', '.join(users)}" if users else "")
            + ". Free memory on that host (or start Ray there with a higher RAY_memory_usage_threshold)")


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


def ray_init_logging(environ: Mapping[str, str]) -> dict[str, Any]:
    """`ray.init`'s logging for this process: the worker `manage.py troupe` starts keeps the
    console quiet (TROUPE_QUIET_CONSOLE=1), so Ray (and Ray Train under it) says only warnings
    there; a worker started by hand keeps Ray's INFO lines in its log."""
    import logging

    return {"logging_level": logging.WARNING if environ.get("TROUPE_QUIET_CONSOLE") == "1" else logging.INFO}


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
            ray.init(address=address, log_to_driver=False, **ray_init_logging(os.environ))
        if threading.current_thread() is threading.main_thread():  # Ray's handler exits at once: keep the worker's warm shutdown
            signal.signal(signal.SIGTERM, on_sigterm)
    cluster = read_cluster()
    scaling = scaling_kwargs(config, cluster_gpus=cluster.total("GPU"))
    ranks, resource = scaling["num_workers"], "GPU" if scaling["use_gpu"] else "CPU"
    name = f"troupe-{out.name}-{uuid.uuid4().hex[:6]}"
    admission = admit(config, sink, cluster, lambda: RayReservation(scaling, name), resource=resource, address=address,
                      wait_s=placement_wait_s(os.environ), poll_s=poll_s)
    if admission.cancelled:
        return cancelled_waiting(config, sink, admission, resource=resource)
    where = placed(config, cluster, admission, resource=resource, address=address)
    report_placed(sink, where)
    out.mkdir(parents=True, exist_ok=True)
    here = ray.get_runtime_context().get_node_id()
    on_this_node = NodeAffinitySchedulingStrategy(node_id=here, soft=False)
    relay = ray.remote(num_cpus=0, scheduling_strategy=on_this_node)(RunRelay).remote()  # type: ignore[call-overload]  # Ray's stub omits node affinity
    trainer = TorchTrainer(
        _rank_loop,
        train_loop_config={"config": config.to_yaml(), "out": str(out), "relay": relay},
        scaling_config=ScalingConfig(**scaling),
        torch_config=TorchConfig(backend="nccl" if scaling["use_gpu"] else "gloo", timeout_s=int(COLLECTIVE_TIMEOUT.total_seconds())),
        run_config=RayRunConfig(
            name=name, storage_path=str(out / "ray"),
            # a failed run is resumed from Troupe's checkpoint, by a person; a placement group Ray Train
            # cannot get within its start timeout fails the run rather than waiting again (see the module docstring)
            failure_config=FailureConfig(max_failures=0, controller_failure_limit=0),  # type: ignore[call-arg]  # v2, as below
            worker_runtime_env={"env_vars": forwarded_env(os.environ)},
        ),  # type: ignore[call-arg]  # Ray Train v2's RunConfig (what `ray.train` gives at run time); the stub is v1's
    )
    sink.log(f"submitting {ranks} ranks ({config.resources.hosts} hosts x {config.resources.gpus} "
             f"{'GPUs' if scaling['use_gpu'] else 'CPU processes'}) to the Ray cluster at {address}; Ray granted "
             + ", ".join(f"{n} rank{'s' if n > 1 else ''} on {node}" for node, n in where["nodes"].items()))
    failure: list[BaseException] = []

    def fit() -> None:
        try:
            trainer.fit()
        except BaseException as exc:  # noqa: BLE001 (handed to the launcher's thread)
            failure.append(exc)

    thread = threading.Thread(target=fit, name="ray-train-fit", daemon=True)  # Ray Train's SIGINT handler only in the main thread
    thread.start()
    outcome = Outcome()
    limit, grace = silent_limit(), stop_grace()
    started, stopped_at = time.time(), None
    try:
        while thread.is_alive():
            if relay_events(relay, sink, outcome) and stopped_at is None:
                stopped_at = time.monotonic()
            # every rank beats into the shared output folder (training.rank.run_rank); a silent one, or
            # ranks still running long after a stop, end the run: the worker never waits on them unbounded
            silent = silent_heartbeats(out / HEARTBEATS, limit=limit, since=started, startup=None)
            if silent:
                raise DistributedRunError(f"{'; '.join(silent)} (stopped or hung; the limit is TROUPE_CHILD_SILENT_SECONDS="
                                          f"{limit:g}): the Ray run was abandoned")
            if stopped_at is not None and time.monotonic() - stopped_at > grace:
                raise DistributedRunError(f"stop requested, and the Ray run had not ended {grace:g} s later "
                                          f"(TROUPE_STOP_GRACE_SECONDS): it was abandoned")
            thread.join(poll_s)
        relay_events(relay, sink, outcome)
    except ray.exceptions.RayError as exc:  # the mailbox is gone (its node died, or Ray's memory monitor killed it)
        raise DistributedRunError(f"the run's event relay on the Ray cluster failed, so rank 0's events cannot reach Troupe; "
                                  f"resume from the last checkpoint. Ray said: {ray_reason(str(exc))}") from exc
    except BaseException:  # the worker is stopping: ask every rank to stop too
        ray_call(relay.request_stop)
        raise
    ray.kill(relay)
    return result_of(outcome, failure[0] if failure else None, ranks=ranks)


def cancelled_waiting(config: RunConfig, sink: EventSink, admission: Admission, *, resource: str) -> TrainResult:
    """The result of a run cancelled while it waited for its placement group: nothing trained, and
    the reason (also a log line) goes with it to the run's page."""
    ranks = config.resources.hosts * config.resources.gpus
    note = (f"cancelled while waiting {admission.waited_s:.0f} s for the Ray cluster to grant its {ranks} "
            f"{'GPUs' if resource == 'GPU' else 'CPUs'}; no rank started, and the reservation was removed")
    sink.log(note)
    start = _start_step(config)
    return TrainResult(status="cancelled", step=start, start_step=start, note=note)


def _start_step(config: RunConfig) -> int:
    """The step a run resuming from `checkpoint.resume_from` starts at (its folder's name, as the
    trainer writes it: `step-000010`), else 0: where a run cancelled before any rank started stands."""
    found = re.search(r"step-(\d+)$", str(config.checkpoint.resume_from or "").rstrip("/"))
    return int(found.group(1)) if found else 0


# == on every Ray Train worker ======================================================================


def _rank_loop(loop_config: dict[str, Any]) -> None:
    """Ray Train's training function: the rank entry torchrun runs, with the mailbox as rank 0's sink
    (imported here, on the Ray worker: the launcher's side needs neither torch nor the engine)."""
    from training.rank import run_rank

    run_rank(RunConfig.from_yaml(loop_config["config"]), Path(loop_config["out"]), ActorRelaySink(loop_config["relay"]))
