"""The data dir is closed to other accounts on the host.

It holds the database (session keys, password hashes, token digests), the secret key, uploaded
datasets, run outputs and checkpoints, emails (password-reset links) and logs: another local
account must not read any of it. Three things keep it so, whatever the umask of the shell that
started Troupe:

- every entry point (manage.py, Daphne through `webapp.asgi`, WSGI, the Celery worker) sets the
  process umask to 077 (`umask_private`), so what it creates is 0600/0700;
- the data dir and the files and folders Troupe creates at its top level (the SQLite database and
  its -wal/-shm/-journal, `secret_key`, `emails/`...) are made 0700/0600 explicitly when settings
  load, whatever the umask (`data_dir_tighten(deep=False)`);
- `manage.py troupe` and a worker starting tighten the whole tree once (`deep=True`), so an install
  made before this kept no world-readable file inside.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from django.core.mail.backends.filebased import EmailBackend

PRIVATE_UMASK = 0o077


def umask_private() -> int:
    """Make what this process creates from now on readable by its own user only; the old umask."""
    return os.umask(PRIVATE_UMASK)


def private_file(path: Path) -> None:
    """Create `path` empty with mode 0600 if it is missing (whatever the umask), else set 0600."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        _tighten(path)
    else:
        os.close(fd)
        os.chmod(path, 0o600)  # O_CREAT's mode is masked by the umask; 0600 is what we want anyway


def _tighten(path: Path) -> bool:
    """Drop the group's and others' bits of one file or folder we own; False if it could not be done."""
    try:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o077:
            return True
        if st.st_uid != os.geteuid():
            return False
        os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def data_dir_tighten(root: Path, *, deep: bool) -> list[Path]:
    """Close `root` (0700) and what lies in it to the group and others: its direct entries, or with
    `deep` the whole tree (links are not followed). Returns what could not be changed (owned by
    another user), which the caller reports."""
    failed = [] if _tighten(root) else [root]
    if not root.is_dir():
        return failed
    if deep:
        for folder, dirs, files in os.walk(root):
            for name in dirs + files:
                path = Path(folder) / name
                if not _tighten(path):
                    failed.append(path)
    else:
        for path in root.iterdir():
            if not _tighten(path):
                failed.append(path)
    if failed:
        logging.getLogger(__name__).warning("%d file(s) in %s belong to another user and stay readable to others, e.g. %s",
                                            len(failed), root, failed[0])
    return failed


class PrivateFileEmailBackend(EmailBackend):
    """Django's file email backend (`EMAIL_BACKEND=file`, the laptop's default) with the folder 0700
    and each email 0600 whatever the umask: an email holds a password-reset or invitation link."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        data_dir_tighten(Path(self.file_path), deep=False)

    def open(self) -> bool:
        if self.stream is None:
            path = Path(self._get_filename())
            private_file(path)
            self.stream = path.open("ab")
            return True
        return False
