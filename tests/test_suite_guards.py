"""The suite's own guards: a test that takes its process down fails the run; it never hangs it.

pytest-xdist 3.8 replaces a crashed worker, and under `--dist loadgroup` (scripts/test.sh) the
replacement can wait forever for work that never comes (pytest-xdist issues 1323, 1327 and 1378):
a segfault in native code (llama.cpp, torch) then held CI to its time limit instead of failing it.
pytest.ini's `--max-worker-restart=0` ends the run at the first crash, naming the test."""

from __future__ import annotations

import configparser
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CRASHING = '''
import os
import signal

import pytest


@pytest.mark.parametrize("i", range(4))
def test_fine(i):
    pass


def test_takes_its_process_down():
    os.kill(os.getpid(), signal.SIGSEGV)


@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    pass
'''


def test_a_test_that_kills_its_worker_fails_the_run_and_never_hangs_it(tmp_path: Path) -> None:
    ini = configparser.ConfigParser()
    ini.read(ROOT / "pytest.ini")
    (tmp_path / "pytest.ini").write_text(f"[pytest]\naddopts = {ini['pytest']['addopts']}\n", encoding="utf-8")
    (tmp_path / "test_crashing.py").write_text(CRASHING, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))}
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:cacheprovider", "-n", "2",
                            "--dist", "loadgroup", str(tmp_path)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:  # the timeout only bounds the hang this test exists to catch: a run that ends takes seconds
        out, _ = run.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        out, _ = run.communicate()
        pytest.fail(f"the run hung after its worker crashed:\n{out}")
    assert run.returncode == 1, out
    assert "FAILED test_crashing.py::test_takes_its_process_down" in out, out
    assert "crashed" in out
