#!/usr/bin/env python
"""Two Ray "hosts" on one machine, to try runs with `resources.hosts: 2` without a second host.

    .venv/bin/python scripts/ray_two_nodes.py [--cpus-per-node 1] [--address-file PATH]

Starts a local Ray cluster with Ray's `ray.cluster_utils.Cluster`: a head node and one worker
node, each with `--cpus-per-node` CPUs (one CPU per rank: the default of 1 gives a 2-rank run one
rank per node). It prints the address to export for Troupe (and writes it to `--address-file`):

    TROUPE_RAY_ADDRESS=<address> .venv/bin/python manage.py troupe

and stays up until Ctrl-C or SIGTERM, which stop every node. To see a host die and come back,
type a command and Enter (or send the signal from another shell; the pid is printed at start):

    kill   (SIGUSR1)  remove the worker node at once, without grace (a host that dies)
    add    (SIGUSR2)  add a worker node again (a host that joins)
    status            list the nodes

Start it from the checkout: the nodes' workers import Troupe from their working directory.
While it is up, a bare `ray.init()` on this machine joins it (Ray's /tmp/ray/ray_current_cluster),
so the suite's tests that start a Ray of their own are run with it stopped. On a host short of
memory, Ray's memory monitor may kill the run's workers: start it with RAY_memory_usage_threshold=0.99.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ray.cluster_utils import Cluster


def retried(start: Any, what: str) -> Any:
    """Ray gives a node 30 s to register, which a loaded machine can miss: start it again, twice."""
    for attempt in range(3):
        try:
            return start()
        except Exception as exc:  # noqa: BLE001 (Ray raises a bare Exception for the timeout)
            if "timed out during startup" not in str(exc) or attempt == 2:
                raise
            print(f"{what} timed out during startup; trying again", flush=True)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpus-per-node", type=int, default=1, help="CPUs (ranks) per node (default 1)")
    parser.add_argument("--address-file", type=Path, help="also write the address to this file")
    args = parser.parse_args()
    node_args = {"num_cpus": args.cpus_per_node}

    cluster = retried(lambda: Cluster(initialize_head=True, head_node_args={**node_args, "include_dashboard": False}), "the head node")

    def add() -> None:
        retried(lambda: cluster.add_node(**node_args), "the worker node")
        cluster.wait_for_nodes()
        print(f"added a worker node: {1 + len(cluster.worker_nodes)} nodes", flush=True)

    def kill() -> None:
        if not cluster.worker_nodes:
            print("no worker node to remove (the head stays)", flush=True)
            return
        node = next(iter(cluster.worker_nodes))
        cluster.remove_node(node, allow_graceful=False)
        print(f"removed the worker node {node.node_id[:8]} without grace: {1 + len(cluster.worker_nodes)} node(s) left", flush=True)

    def status() -> None:
        nodes = [("head", cluster.head_node)] + [("worker", n) for n in cluster.worker_nodes]
        for role, n in nodes:
            print(f"  {role:<6} {n.node_id[:8]} {n.node_ip_address}", flush=True)

    add()
    print(f"Ray cluster of 2 nodes ({args.cpus_per_node} CPU each), pid {os.getpid()}; export\n"
          f"  TROUPE_RAY_ADDRESS={cluster.address}\n"
          f"kill / SIGUSR1: remove the worker node; add / SIGUSR2: add one; status; Ctrl-C / SIGTERM: stop", flush=True)
    if args.address_file:
        args.address_file.write_text(cluster.address + "\n")

    commands: queue.Queue[str] = queue.Queue()  # the Ray calls run here, never in a signal handler
    signal.signal(signal.SIGUSR1, lambda *_: commands.put("kill"))
    signal.signal(signal.SIGUSR2, lambda *_: commands.put("add"))
    signal.signal(signal.SIGTERM, lambda *_: commands.put("stop"))
    if sys.stdin.isatty():
        threading.Thread(target=lambda: [commands.put(line.strip()) for line in sys.stdin], daemon=True).start()
    try:
        while True:
            try:
                command = commands.get(timeout=1.0)
            except queue.Empty:
                continue
            if command == "stop":
                break
            actions = {"kill": kill, "add": add, "status": status}
            if command in actions:
                try:
                    actions[command]()
                except Exception as exc:  # noqa: BLE001 (say it and stay up: the person may try again)
                    print(f"{command} failed: {exc}", flush=True)
            elif command:
                print(f"unknown command {command!r}: kill, add, status", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping the Ray nodes", flush=True)
        cluster.shutdown()


if __name__ == "__main__":
    main()
