"""Where Troupe keeps a team's files in the data dir (`TROUPE_DATA_DIR`), and the one check that
a path lies inside a folder. Every module that builds or checks these paths goes through here."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings


def data_dir() -> Path:
    return Path(settings.TROUPE_DATA_DIR)


def run_dir(run_id: int) -> Path:
    """A run's output folder: checkpoints, metrics and rollout files."""
    return data_dir() / "runs" / str(run_id)


def exports_dir(team_id: int) -> Path:
    """A team's merged model exports."""
    return data_dir() / "exports" / str(team_id)


def inside(path: Path, root: Path, *, strictly: bool = False) -> bool:
    """Whether `path`, links resolved, lies in `root` (or is `root` itself unless `strictly`);
    False for a path that cannot be resolved."""
    try:
        resolved, base = path.resolve(), root.resolve()
    except OSError:
        return False
    return resolved.is_relative_to(base) and not (strictly and resolved == base)
