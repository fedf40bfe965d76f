"""`agents` stays below the engine and the web: no Django, no torch, no `training`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_it_imports_without_django_torch_or_training() -> None:
    code = (
        "import agents, agents.base, agents.envs, agents.sandbox, agents.verifiers, agents.parsing; import sys; "
        "bad = [m for m in ('django', 'torch', 'training') if m in sys.modules]; "
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
