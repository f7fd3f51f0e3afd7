"""The one way fastlab writes a file (results, figures, tables, stores, caches, timings): atomically, so a reader
never sees half a file and a crash or a full disk keeps the earlier one; a write that fails says, in one line, the
path, why, and what was kept."""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import threading
from pathlib import Path
from typing import Any


class NotWritten(OSError):
    """A file fastlab could not write: its path, the reason, and what was kept (the earlier file, unchanged)."""

    def __init__(self, path: Path, cause: OSError, kept: str) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause), str(path))
        self.path, self.kept = path, kept

    @property
    def fix(self) -> str:
        if self.errno in (errno.ENOSPC, errno.EDQUOT):
            return "free some space on that disk, or write to another folder"
        return "check the folder's permissions, or write to another folder"

    def __str__(self) -> str:
        return f"could not write {self.path} ({self.strerror}): {self.kept}"


def write_atomic(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write `data` (text as UTF-8) to `path` through a temporary file beside it, synced, then renamed over it. The
    file is created by open(), so it gets the mode the umask gives any other file."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise NotWritten(path, e, "the earlier file is kept, unchanged" if existed else "nothing was written") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, doc: Any, sort_keys: bool = False) -> Path:
    """`doc` as indented JSON, atomically (write_atomic)."""
    return write_atomic(path, json.dumps(doc, indent=1, sort_keys=sort_keys) + "\n")


def keep_aside(path: Path, why: str, then: str) -> Path:
    """A file fastlab reads but cannot use, renamed beside itself (never overwritten, never dropped), said in one
    line: its path, `why` (what is wrong), where it was kept, and `then` (what fastlab does instead)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H%M%S")
    aside = path.with_name(f"{path.name}.unreadable-{stamp}")
    os.replace(path, aside)
    print(f"fastlab: {path} {why}; kept it as {aside.name} and {then}")
    return aside
