"""scripts/compose_check.sh end to end: build the CPU image, bring up PostgreSQL, Redis, migrations,
the web and a CPU worker with docker/compose.yaml, log in, launch a tiny run through the API, restart
and find it again, run a second worker from docker/compose.worker.yaml, tear down. Runs where a
Docker daemon answers (minutes: it builds images); skipped where none does, as in CI."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.skipif(not docker_answers(), reason="no Docker daemon answers")
def test_the_compose_stack_runs_a_run_survives_a_restart_and_takes_a_second_worker():
    result = subprocess.run([str(ROOT / "scripts" / "compose_check.sh")], capture_output=True, text=True, timeout=3600,
                            check=False, env={**os.environ, "TROUPE_CHECK_PROJECT": "troupe-pytest"})
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    for line in ("/healthz ok", "logged in as", "succeeded after", "after the restart: run", "ran on cpu1@", "compose check passed"):
        assert line in result.stdout, line
