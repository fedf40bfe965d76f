"""The GPU extra installs with plain pip: `pip install -r requirements-gpu.txt` resolves, with
requirements.txt's pins and the lock (constraints-gpu.txt) that docker/Dockerfile.gpu uses too.

Resolving it for real needs the package index but no GPU: `uv pip compile` reads the metadata of
the CUDA wheels (torch, vLLM, nvidia-*) without downloading them (a few seconds, tens of MB of
cache). pip's own `install --dry-run --report` would download every wheel first, GBs of CUDA
libraries, so the suite does not run it. Same inputs, same metadata: a pin that pip could not
satisfy fails here too (numpy 2.4.6 against vLLM 0.30's mistral-common did)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def pins(path: Path) -> dict[str, str]:
    """`name==version` lines of a requirements or constraints file (names normalised)."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;#]+)", line.strip())
        if m:
            out[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return out


def test_the_gpu_extra_reads_the_lock_and_the_cpu_pins() -> None:
    lines = (ROOT / "requirements-gpu.txt").read_text(encoding="utf-8").splitlines()
    assert "-r requirements.txt" in lines and "-c constraints-gpu.txt" in lines
    lock, cpu, gpu = pins(ROOT / "constraints-gpu.txt"), pins(ROOT / "requirements.txt"), pins(ROOT / "requirements-gpu.txt")
    assert lock["vllm"] == gpu["vllm"] and lock["torch"] == cpu["torch"]
    stale = {name: (version, lock[name]) for name, version in {**cpu, **gpu}.items() if name in lock and lock[name] != version}
    assert not stale, f"constraints-gpu.txt disagrees with the requirements (run `make gpu-constraints`): {stale}"


@pytest.mark.slow
def test_pip_install_of_the_gpu_extra_resolves_on_a_cuda_host(tmp_path: Path) -> None:
    uv = Path(sys.executable).with_name("uv")
    uv_path = str(uv) if uv.exists() else shutil.which("uv")
    assert uv_path, "uv is in requirements.txt: reinstall the venv (make install)"
    proc = subprocess.run(
        [uv_path, "pip", "compile", "requirements-gpu.txt", "--no-config", "--python-version", "3.11",
         "--python-platform", "x86_64-manylinux_2_28", "--no-header", "--no-annotate", "--cache-dir", str(tmp_path / "cache")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0 and re.search(r"(?i)failed to fetch|dns|connect|network|timed out", proc.stderr) and "No solution" not in proc.stderr:
        pytest.skip(f"the package index is unreachable: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, f"requirements-gpu.txt does not resolve (after changing requirements.txt, re-lock with `make gpu-constraints`):\n{proc.stderr[-3000:]}"
    resolved = {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)$", proc.stdout, re.M)}
    lock = pins(ROOT / "constraints-gpu.txt")
    unlocked = {name: version for name, version in resolved.items() if lock.get(name) != version}
    assert not unlocked, f"packages the lock does not pin (run `make gpu-constraints`): {unlocked}"
    assert resolved["torch"] == pins(ROOT / "requirements.txt")["torch"] and "nvidia-cublas" in resolved  # the CUDA build's dependencies
