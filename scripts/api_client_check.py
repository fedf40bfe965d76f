"""A client generated from the API's OpenAPI document launches a run and lists runs.

    .venv/bin/python scripts/api_client_check.py

Starts Troupe (`manage.py troupe --no-worker`) on a fresh data folder with the demo team, reads
/api/v1/openapi.json from it, generates a Python client with openapi-python-client (installed in
a throwaway virtual environment, with its own dependencies), and with that client alone: launches
a run of the demo team's first topology on its first dataset (JSON body, as the README's example)
and lists the team's runs. Nothing is left behind but what it prints; the run stays queued (no
worker), which is all the check needs. Needs network access to the package index once.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
GENERATOR = "openapi-python-client==0.29.1"

CLIENT_CODE = r'''
import json, sys
from troupe_client import AuthenticatedClient
from troupe_client.api.runs import run_launch, runs
from troupe_client.api.catalog import topology_list, dataset_list
from troupe_client.models import LaunchIn

client = AuthenticatedClient(base_url=sys.argv[1], token=sys.argv[2])
topology = topology_list.sync(client=client).results[0]
dataset = next(d for d in dataset_list.sync(client=client).results if d.environment == topology.environment and d.kind != "chats")
body = LaunchIn.from_dict({"topology": topology.id, "dataset": dataset.id, "name": "from a generated client", "tags": ["generated"],
                           "config": {"optim": {"steps": 2, "tasks_per_step": 2}, "grpo": {"k": 2}}})
launched = run_launch.sync_detailed(client=client, body=body)
print("launch:", launched.status_code.value, launched.parsed.__class__.__name__, "id", launched.parsed.id,
      "status", launched.parsed.status, "topology", launched.parsed.topology.name)
assert launched.status_code.value == 201, launched.content
listing = runs.sync(client=client, per_page=5)
print("list:", listing.count, "run(s);", [(r.id, r.name, r.status, r.tags) for r in listing.results])
assert launched.parsed.id in [r.id for r in listing.results]
bad = run_launch.sync_detailed(client=client, body=LaunchIn.from_dict({"topology": 999999, "config": {}}))
print("bad launch:", bad.status_code.value, json.loads(bad.content))
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="troupe-client-") as temp:
        tmp = Path(temp)
        env = {**os.environ, "TROUPE_DATA_DIR": str(tmp / "data")}
        env.pop("DATABASE_URL", None)
        subprocess.run([PYTHON, "manage.py", "troupe", "--seed-only"], cwd=ROOT, env=env, check=True, capture_output=True)
        token = subprocess.run(
            [PYTHON, "manage.py", "shell", "-c",
             "from webapp.models import Team, Membership; from webapp.teams import services as s; "
             "m = Membership.objects.select_related('user', 'team').order_by('pk').first(); "
             "print(s.api_token_create(user=m.user, team=m.team, name='generated client')[1])"],
            cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([PYTHON, "manage.py", "troupe", "--no-worker", "--port", str(port)], cwd=ROOT, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):  # until the server answers (a cold start migrates and collects static files)
                try:
                    document = json.load(urllib.request.urlopen(f"{base}/api/v1/openapi.json", timeout=2))
                    break
                except OSError:
                    if server.poll() is not None:
                        raise SystemExit("the server exited before answering") from None
                    time.sleep(0.5)
            else:
                raise SystemExit("the server did not answer in 5 minutes")
            print(f"document: OpenAPI {document['openapi']}, {len(document['paths'])} paths, "
                  f"{sum(len([m for m in p if m != 'parameters']) for p in document['paths'].values())} operations")
            venv = tmp / "generator"
            subprocess.run([PYTHON, "-m", "venv", str(venv)], check=True)
            subprocess.run([venv / "bin" / "pip", "install", "-q", GENERATOR], check=True)
            (tmp / "openapi.json").write_text(json.dumps(document))
            subprocess.run([venv / "bin" / "openapi-python-client", "generate", "--path", str(tmp / "openapi.json"), "--meta", "none",
                            "--output-path", str(tmp / "client" / "troupe_client")], check=True, capture_output=True)
            subprocess.run([venv / "bin" / "python", "-c", CLIENT_CODE, base, token], cwd=tmp / "client", check=True)
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
