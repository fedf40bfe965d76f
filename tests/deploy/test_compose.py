"""docker/compose.yaml (and the extra-worker files) agree with what the app reads and with
.env.example: read as YAML and plain text, no Docker engine needed."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from webapp.core.sockets import DAPHNE_ARGS

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE_FILES = ("compose.yaml", "compose.worker.yaml", "compose.shared-data.yaml")
APP_IMAGES = ("troupe:local", "troupe-gpu:local")


def load(name: str = "compose.yaml") -> dict[str, Any]:
    return yaml.safe_load((DOCKER / name).read_text(encoding="utf-8"))


def app_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services that run Troupe's own images (not postgres or redis)."""
    return {name: svc for name, svc in compose["services"].items() if svc.get("image") in APP_IMAGES}


def env_vars_the_app_reads() -> set[str]:
    """Names read through webapp.core.env's helpers (`env_str("X")`, ...) or `os.environ.get("X")`,
    `os.environ["X"]`, `os.getenv("X")` anywhere in webapp/, training/ and agents/."""
    names: set[str] = set()
    files = [p for pkg in ("webapp", "training", "agents") for p in (ROOT / pkg).rglob("*.py")]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            key = None
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
                if (isinstance(func, ast.Name) and name.startswith("env_")) or (owner, name) in (
                    ("os.environ", "get"),
                    ("os", "getenv"),
                ):
                    key = node.args[0].value
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ" and isinstance(node.ctx, ast.Load):
                if isinstance(node.slice, ast.Constant):
                    key = node.slice.value
            if isinstance(key, str) and key.isupper():
                names.add(key)
    return names


def env_example() -> tuple[set[str], set[str]]:
    """(variables set in .env.example, variables only mentioned there as `# NAME=...`)."""
    text = (ROOT / ".env.example").read_text(encoding="utf-8")
    set_ = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", text, re.M))
    commented = set(re.findall(r"^#\s*([A-Z][A-Z0-9_]*)=", text, re.M))
    return set_, commented - set_


def interpolated(text: str) -> dict[str, bool]:
    """`${NAME...}` variables of a compose file -> whether they are required (`${NAME:?...}`)."""
    found: dict[str, bool] = {}
    for name, op in re.findall(r"(?<!\$)\$\{([A-Z][A-Z0-9_]*)(:?[?\-]?)", text):
        found[name] = found.get(name, False) or op == ":?"
    return found


# -- the settings side ----------------------------------------------------------------------------


def test_it_finds_the_variables_the_settings_read():
    read = env_vars_the_app_reads()
    assert {"SECRET_KEY", "DEBUG", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL", "TROUPE_DATA_DIR"} <= read


def test_every_variable_compose_sets_for_the_app_is_one_the_app_reads():
    read = env_vars_the_app_reads()
    for name in COMPOSE_FILES[:2]:
        for service, svc in app_services(load(name)).items():
            unknown = set(svc.get("environment", {})) - read
            assert not unknown, f"{name} {service} sets {sorted(unknown)}, which Troupe never reads"


LAUNCHER_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TROUPE_QUIET_CONSOLE"}
"""Set by a launcher for the processes it starts, never by a deployer: torchrun for the processes
of one multi-GPU run (training.distributed), `manage.py troupe` for its local worker (a quiet console)."""


def test_every_variable_the_app_reads_is_documented_in_env_example():
    set_, commented = env_example()
    missing = env_vars_the_app_reads() - set_ - commented - LAUNCHER_VARIABLES
    assert not missing, f".env.example does not document {sorted(missing)}"


def test_required_variables_are_set_in_env_example():
    set_, _ = env_example()
    required = {"SECRET_KEY"}  # settings refuse to start without it when DEBUG is off
    for name in COMPOSE_FILES:
        required |= {var for var, req in interpolated((DOCKER / name).read_text(encoding="utf-8")).items() if req}
    # extra-worker-only variables are commented out: the main host does not set them
    worker_only = {"DATABASE_URL", "REDIS_URL", "TROUPE_SHARED_DATA"}
    assert required - worker_only <= set_, f"set these in .env.example: {sorted(required - worker_only - set_)}"
    _, commented = env_example()
    assert worker_only <= commented | set_


def test_every_compose_variable_is_documented_in_env_example():
    set_, commented = env_example()
    for name in COMPOSE_FILES:
        variables = set(interpolated((DOCKER / name).read_text(encoding="utf-8")))
        assert variables <= set_ | commented, f"{name}: document {sorted(variables - set_ - commented)}"


def test_app_services_read_the_env_file_next_to_env_example():
    for name in COMPOSE_FILES[:2]:
        for service, svc in app_services(load(name)).items():
            assert svc.get("env_file") == "${TROUPE_ENV_FILE:-../.env}", f"{name} {service}"  # ../.env unless the shell says


# -- services, health checks, start order ---------------------------------------------------------


def test_it_runs_web_worker_redis_postgres_and_a_one_shot_migration():
    services = load()["services"]
    assert {"web", "worker-gpu", "redis", "postgres", "migrate"} <= set(services)
    assert services["migrate"]["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert services["migrate"]["restart"] == "no"
    # Daphne with the socket limits every start of Troupe's web process passes (webapp.core.sockets)
    assert services["web"]["command"] == ["daphne", "-b", "0.0.0.0", "-p", "8000", *DAPHNE_ARGS, "webapp.asgi:application"]


@pytest.mark.parametrize("service", ["web", "worker-gpu", "redis", "postgres"])
def test_every_long_running_service_has_a_health_check(service):
    check = load()["services"][service]["healthcheck"]
    assert check["test"] and check["interval"] and check["retries"]


def test_the_web_health_check_asks_healthz():
    test = load()["services"]["web"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "/app/docker/healthcheck.py"] and test[3] == "web"
    assert '"http://127.0.0.1:8000/healthz"' in (DOCKER / "healthcheck.py").read_text(encoding="utf-8")


def test_app_services_start_after_migrations_and_healthy_backing_services():
    services = load()["services"]
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in ("web", "worker-gpu"):
        assert services[name]["depends_on"] == {
            "migrate": {"condition": "service_completed_successfully"},
            "postgres": {"condition": "service_healthy"},
            "redis": {"condition": "service_healthy"},
        }


def test_app_services_point_at_the_bundled_postgres_and_redis():
    for service, svc in app_services(load()).items():
        env = svc["environment"]
        assert env["DATABASE_URL"].startswith("postgres://troupe:${POSTGRES_PASSWORD:?"), service
        assert env["DATABASE_URL"].endswith("@postgres:5432/troupe"), service
        assert env["REDIS_URL"].startswith("redis://:${REDIS_PASSWORD:?"), service
        assert env["REDIS_URL"].endswith("@redis:6379/0"), service


# -- the GPU worker -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", COMPOSE_FILES[:2])
def test_the_gpu_worker_reserves_an_nvidia_gpu_and_listens_on_the_gpu_queue(name):
    worker = load(name)["services"]["worker-gpu"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert device["device_ids"] == ["${TROUPE_GPU:-0}"]  # one GPU per worker (or the list of a multi-GPU worker's)
    command = worker["command"]
    assert command[:4] == ["celery", "-A", "webapp", "worker"]
    # the queue of one-GPU runs; an extra worker may serve the queue of runs of its GPU count instead
    assert command[command.index("-Q") + 1] == ("gpu" if name == "compose.yaml" else "${TROUPE_QUEUES:-gpu}")
    assert command[command.index("-P") + 1] == "solo"  # the run executes in the worker process: stop signals reach it
    assert command[command.index("-c") + 1] == "1"  # one run at a time
    node = "gpu${TROUPE_GPU:-0}@%h" if name == "compose.yaml" else "${TROUPE_WORKER_NAME:-gpu${TROUPE_GPU:-0}}@%h"
    assert command[command.index("--hostname") + 1] == node
    assert worker["healthcheck"]["test"][-1] == node  # pings this very worker
    assert worker["build"]["dockerfile"] == "docker/Dockerfile.gpu"


def test_only_the_gpu_worker_gets_the_gpu_image():
    services = load()["services"]
    assert services["worker-gpu"]["image"] == "troupe-gpu:local"
    assert {services[s]["build"]["dockerfile"] for s in ("web", "migrate")} == {"docker/Dockerfile"}


# -- the data volume ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", COMPOSE_FILES[:2])
def test_the_data_volume_is_mounted_where_troupe_data_dir_points(name):
    compose = load(name)
    for service, svc in app_services(compose).items():
        data_dir = svc["environment"]["TROUPE_DATA_DIR"]
        mounts = {m.split(":")[1]: m.split(":")[0] for m in svc["volumes"]}
        assert data_dir in mounts, f"{name} {service}: nothing mounted at {data_dir}"
        assert mounts[data_dir] in compose["volumes"], f"{name} {service}: {mounts[data_dir]} is not a named volume"


def test_web_and_workers_share_one_data_volume():
    services = app_services(load())
    assert {tuple(svc["volumes"]) for svc in services.values()} == {("data:/data",)}


def test_extra_hosts_bind_the_shared_data_directory():
    for name in ("compose.worker.yaml", "compose.shared-data.yaml"):
        opts = load(name)["volumes"]["data"]["driver_opts"]
        assert opts["type"] == "none" and opts["o"] == "bind"
        assert opts["device"].startswith("${TROUPE_SHARED_DATA:?")


# -- images ---------------------------------------------------------------------------------------


def test_backing_service_images_are_pinned():
    for service in ("postgres", "redis"):
        image = load()["services"][service]["image"]
        # the official image unless the shell names another (${TROUPE_POSTGRES_IMAGE:-postgres:17.6-bookworm})
        image = re.fullmatch(r"\$\{TROUPE_[A-Z]+_IMAGE:-(.+)\}", image).group(1)
        assert image.startswith(f"{service}:")
        name, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.match(r"^\d+\.\d+", tag), f"{service}: pin {image}"


def test_app_images_are_never_tagged_latest():
    for name in COMPOSE_FILES[:2]:
        for svc in app_services(load(name)).values():
            assert not svc["image"].endswith(":latest")


# -- compose itself (when a Compose v2 binary is installed) ---------------------------------------


def compose_command() -> list[str] | None:
    for candidate in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(candidate[0]) is None:
            continue
        try:
            out = subprocess.run([*candidate, "version", "--short"], capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip().lstrip("v").startswith("2"):
            return candidate
    return None


@pytest.mark.skipif(compose_command() is None, reason="no Docker Compose v2 here")
def test_compose_accepts_the_files_with_the_example_env(tmp_path):
    env = tmp_path / "env"
    env.write_text(
        (ROOT / ".env.example").read_text(encoding="utf-8")
        + "\nSECRET_KEY=x\nPOSTGRES_PASSWORD=p\nREDIS_PASSWORD=r\nTROUPE_SHARED_DATA=/srv/troupe\n"
        "DATABASE_URL=postgres://troupe:p@10.0.0.2:5432/troupe\nREDIS_URL=redis://:r@10.0.0.2:6379/0\n",
        encoding="utf-8",
    )
    base = [*compose_command(), "--env-file", str(env)]  # type: ignore[misc]
    # env_file: ../.env must exist for `config`; point it at the example in a scratch copy
    scratch = tmp_path / "repo"
    shutil.copytree(DOCKER, scratch / "docker")
    shutil.copy(env, scratch / ".env")
    for files in (["compose.yaml"], ["compose.yaml", "compose.shared-data.yaml"], ["compose.worker.yaml"]):
        args = [a for f in files for a in ("-f", str(scratch / "docker" / f))]
        result = subprocess.run([*base, *args, "config", "--quiet"], capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, f"{files}: {result.stderr}"
