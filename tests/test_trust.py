"""Fault injection: files, folders and untrusted input (docs/guarantees.md).

Each test breaks something on purpose (a crash in the middle of a save, a reader racing a writer, a hostile
or damaged file) and checks that medadapt gives the old or the new state, or one clear error, never a mix
or a silent wrong number.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from medadapt import io as mio

# ---------------------------------------------------------------- files and folders


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_files_get_the_users_usual_mode(tmp_path, umask, expected):
    old = os.umask(umask)
    try:
        mio.atomic_write_text(tmp_path / "a.txt", "x")
        with open(tmp_path / "plain.txt", "w") as f:  # what any other tool would create
            f.write("x")
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == expected
    assert (tmp_path / "plain.txt").stat().st_mode & 0o777 == expected


def _write_version(folder: Path, version: int, n_files: int = 4) -> None:
    for i in range(n_files):
        (folder / f"part-{i}.txt").write_text(str(version))
    (folder / "manifest.txt").write_text(str(version))


def test_replace_folder_never_shows_a_reader_no_folder_or_a_mix(tmp_path):
    """At every instant the path holds the old or the new folder (one ``renameat2`` exchange). A reader that
    spans a swap notices it the way medadapt's loaders do (the manifest read again after the files differs)
    and reads again; what it accepts is never a mix, and it never finds no folder."""
    target = tmp_path / "model"
    with mio.replace_folder(target) as tmp:
        _write_version(tmp, 0)
    stop, problems, reads, retries = threading.Event(), [], [0], [0]

    def reader():
        while not stop.is_set():
            try:
                before = (target / "manifest.txt").read_text()
                versions = {(target / f"part-{i}.txt").read_text() for i in range(4)}
                after = (target / "manifest.txt").read_text()
            except FileNotFoundError as exc:  # the old folder renamed away before the new one arrived
                problems.append(f"missing: {exc.filename}")
                continue
            if before != after:
                retries[0] += 1
                continue
            if versions != {before}:
                problems.append(f"mix: {sorted(versions)} under manifest {before}")
            reads[0] += 1

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for version in range(1, 300):
            with mio.replace_folder(target) as tmp:
                _write_version(tmp, version)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert reads[0] > 0
    assert not problems, problems[:5]
    assert (target / "part-0.txt").read_text() == "299"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing left beside it


def test_a_failure_inside_replace_folder_keeps_the_old_folder(tmp_path):
    target = tmp_path / "run"
    with mio.replace_folder(target) as tmp:
        _write_version(tmp, 1)
    with pytest.raises(RuntimeError), mio.replace_folder(target) as tmp:
        _write_version(tmp, 2, n_files=2)
        raise RuntimeError("disk full")
    assert {p.read_text() for p in target.iterdir()} == {"1"} and len(list(target.iterdir())) == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_process_killed_while_writing_leaves_the_old_folder_and_its_leftover_is_cleaned(tmp_path):
    target = tmp_path / "run"
    with mio.replace_folder(target) as tmp:
        _write_version(tmp, 1)
    code = ("import os, sys; from medadapt import io\n"
            f"with io.replace_folder({str(target)!r}) as tmp:\n"
            "    (tmp / 'part-0.txt').write_text('2')\n"
            "    os.kill(os.getpid(), 9)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True)
    assert proc.returncode == -9
    leftovers = [p for p in tmp_path.iterdir() if p.name != "run"]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".run.tmp-")
    assert {p.read_text() for p in target.iterdir()} == {"1"}
    with mio.replace_folder(target) as tmp:  # the next save cleans the dead writer's folder
        _write_version(tmp, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_live_writers_temporary_folder_is_not_cleaned(tmp_path):
    target = tmp_path / "run"
    live = tmp_path / f".run.tmp-{os.getppid()}-abcd1234"  # a running process's (our parent's) folder
    live.mkdir()
    dead = tmp_path / f".run.tmp-{_dead_pid()}-abcd1234"
    dead.mkdir()
    mio.clean_leftovers(target)
    assert live.exists() and not dead.exists()


def test_fallback_crash_between_renames_is_repaired(tmp_path, monkeypatch):
    """Where no atomic exchange exists, the old folder is renamed away first; a crash right then leaves
    ``.<name>.old-*`` and no target: the next writer (or reader through clean_leftovers) puts it back."""
    target = tmp_path / "index"
    monkeypatch.setattr(mio, "_exchange", lambda a, b: False)
    with mio.replace_folder(target) as tmp:
        _write_version(tmp, 1)
    with mio.replace_folder(target) as tmp:  # the fallback path works end to end
        _write_version(tmp, 2)
    assert {p.read_text() for p in target.iterdir()} == {"2"}
    os.replace(target, tmp_path / f".index.old-{_dead_pid()}-abcd1234")  # the crash, frozen in time
    mio.clean_leftovers(target)
    assert {p.read_text() for p in target.iterdir()} == {"2"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]
