"""The README's examples run as written. The test reads them from README.md itself (so it fails
when the README drifts from the code): the API blocks run under bash against a real stack
(Daphne, Redis, a Celery worker), with a token made for the test pasted where the README says
to paste one; the command-line block runs in a folder laid out like the repository's root. Only
a line the README itself says takes about an hour is left out."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from tests.processes import Processes
from webapp.models import Job, Membership, Run, Team
from webapp.teams.services import api_token_create

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_URL = "http://127.0.0.1:8000"
HOUR_LONG = "about an hour"


def sh_blocks(section: str) -> list[str]:
    """The ```sh blocks of the README section whose heading is `section` (up to the next heading of
    the same or a higher level)."""
    text = README.read_text(encoding="utf-8")
    level = len(section) - len(section.lstrip("#"))
    start = text.index(section + "\n")
    end = re.search(rf"^#{{1,{level}}} ", text[start + len(section):], flags=re.M)
    body = text[start: start + len(section) + (end.start() if end else len(text))]
    return re.findall(r"^```sh\n(.*?)^```", body, flags=re.M | re.S)


def test_the_readme_has_the_examples_this_test_runs():
    api = sh_blocks("### API")
    assert len(api) == 2 and "TOKEN=trp_..." in api[0] and "$API/runs/$RUN/evaluations/" in api[1]
    assert "@configs/sums.jsonl" in api[1] and (ROOT / "configs" / "sums.jsonl").is_file()  # a file the repository ships
    assert not re.search(r"/(?:runs|jobs)/\d+/", "".join(api))  # no made-up ids: each comes from an answer
    cli = sh_blocks("## Train from the command line")[0]
    assert [line for line in cli.splitlines() if HOUR_LONG in line] == [cli.splitlines()[-1]]


@pytest.fixture
def stack(tmp_path: Path, settings, transactional_db) -> Iterator[Processes]:
    data = tmp_path / "data"
    data.mkdir()
    settings.TROUPE_DATA_DIR = data
    s = Processes(data_dir=data, log_dir=tmp_path).start()
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.slow
def test_the_api_examples_run_as_written(stack: Processes, tmp_path: Path):
    team = Team.objects.create(name="Readers")
    user = User.objects.create_user("reader", password="a long pass phrase")
    Membership.objects.create(team=team, user=user, role=Membership.Role.ADMIN)
    _, token = api_token_create(user=user, team=team, name="readme")
    script = "\n".join(sh_blocks("### API")).replace("TOKEN=trp_...", f"TOKEN={token}").replace(README_URL, stack.url)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{stack.logs()}"
    assert Run.objects.filter(team=team, status=Run.Status.SUCCEEDED, name__contains="api pair").count() == 1
    assert Run.objects.filter(team=team, name="tiny-lora").count() == 1  # the YAML launch
    assert set(Job.objects.filter(team=team).values_list("kind", flat=True)) == {Job.Kind.EVALUATE, Job.Kind.PLAYGROUND}
    assert '"status"' in done.stdout  # the job poll printed the job


@pytest.mark.slow
def test_the_command_line_examples_run_as_written(tmp_path: Path):
    for name in (".venv", "configs", "training", "agents"):  # the repository's root, with its own runs/ folder
        (tmp_path / name).symlink_to(ROOT / name)
    block = sh_blocks("## Train from the command line")[0].replace("\\\n", " ")  # a command continued with \ is one line
    lines = [line for line in block.splitlines() if line.strip() and HOUR_LONG not in line]
    env = {**os.environ, "TROUPE_DATA_DIR": str(tmp_path / "data"), "OMP_NUM_THREADS": "1"}
    for line in lines:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    assert (tmp_path / "runs" / "tiny" / "checkpoints" / "step-000002").is_dir()
