"""One atomic writer for every file fastlab writes (fastlab.files): a full disk or a read-only folder keeps the earlier
file whole and says, in one line, the path, why and what was kept. The full disk is a small tmpfs where this machine
lets the test mount one, else a writer whose sync raises ENOSPC as a full disk's does."""

from __future__ import annotations

import errno
import subprocess

import pytest

from fastlab import files
from fastlab.__main__ import main
from fastlab.bench import write_report
from fastlab.config import config_for
from fastlab.results import RunResult, save_results


def results(label_speed: dict[str, float]) -> list[RunResult]:
    cfg = config_for("smoke").to_dict()
    return [RunResult(config=cfg, label=label, window_throughput=[speed, speed * 1.01], steps_done=10,
                      rung=label) for label, speed in label_speed.items()]


class Disk:
    """A folder, and a way to fill the disk it is on."""

    def __init__(self, tmp_path, monkeypatch) -> None:
        self.folder, self.mounted, self.monkeypatch = tmp_path / "disk", False, monkeypatch
        self.folder.mkdir()
        try:
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(self.folder)],
                               capture_output=True, timeout=30)
            self.mounted = r.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            pass

    def fill(self) -> None:
        if not self.mounted:  # no tmpfs here: every write's sync fails as a full disk's does
            def no_space(fd: int) -> None:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.monkeypatch.setattr(files.os, "fsync", no_space)
            return
        with open(self.folder / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.folder)], capture_output=True, timeout=30)


@pytest.fixture
def disk(tmp_path, monkeypatch):
    d = Disk(tmp_path, monkeypatch)
    yield d
    d.close()


def test_a_full_disk_keeps_the_earlier_figure_table_and_results_whole(disk, capsys):
    path = save_results(disk.folder / "results.json", results({"naive": 100.0, "amp": 150.0}))
    png, md = write_report(path)
    before = {p: p.read_bytes() for p in (path, png, md)}
    disk.fill()
    with pytest.raises(files.NotWritten) as raised:
        write_report(path)
    assert str(raised.value) == f"could not write {png} (No space left on device): the earlier file is kept, unchanged"
    with pytest.raises(files.NotWritten):
        save_results(path, results({"naive": 1.0}))
    assert {p: p.read_bytes() for p in before} == before  # nothing truncated
    assert not list(disk.folder.glob("*.tmp"))  # and nothing half-written left beside them
    assert main(["report", str(path)]) == 2
    line = capsys.readouterr().err.strip()
    assert line == (f"fastlab: could not write {png} (No space left on device): the earlier file is kept, unchanged "
                    "— free some space on that disk, or write to another folder")


def test_a_new_file_that_cannot_be_written_says_nothing_was(tmp_path, monkeypatch):
    def read_only(src, dst):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(files.os, "replace", read_only)
    with pytest.raises(files.NotWritten) as raised:
        files.write_json(tmp_path / "new.json", {"a": 1})
    assert str(raised.value).endswith("(Read-only file system): nothing was written")
    assert "permissions" in raised.value.fix and not list(tmp_path.iterdir())


def test_every_file_fastlab_writes_goes_through_the_one_writer():
    """No write_text, write_bytes, savefig to a path or json.dump to a file outside fastlab/files.py (logs a
    subprocess streams into, and a launch's own scratch files, excepted by name)."""
    import re
    from pathlib import Path

    allowed = {"ddp.py", "distributed.py", "files.py", "technique_code.py", "export.py", "__main__.py"}
    found = []
    for p in (Path(files.__file__).parent).rglob("*.py"):
        if p.name in allowed:
            continue
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if ".lock" not in line and re.search(r"\.write_(text|bytes)\(|savefig\([^b]|json\.dump\(|open\([^)]*[\"']w", line):
                found.append(f"{p.name}:{n}: {line.strip()}")
    assert not found, found
