"""medadapt.io's output policy (check_output), folder writes through symlinks, temporary names unique per
process and thread, and cleanup that never removes a live writer's folder (docs/guarantees.md)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from medadapt import io as mio
from medadapt.errors import ConfigError

ART = mio.FolderKind("a test artefact", ("marker.json",))


def _snapshot(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root`` (hidden ones too): file bytes, or the kind of a non-file."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = f"link->{os.readlink(p)}"
        elif p.is_file():
            out[rel] = p.read_bytes()
        elif p.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = f"node {stat.S_IFMT(p.lstat().st_mode)}"
    return out


# ------------------------------------------------------------------------------------ check_output: files
def _folder(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("keep")
    return tmp_path / "out", "is an existing folder"


def _fifo(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    return tmp_path / "fifo", "not a regular file"


def _under_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    return tmp_path / "afile" / "m.json", "afile is not a folder"


def _link_to_a_folder(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    return tmp_path / "link", "is an existing folder"


@pytest.mark.parametrize("case", [_folder, _fifo, _under_a_file, _link_to_a_folder])
def test_a_file_output_that_cannot_be_a_file_is_refused_naming_it(tmp_path, case):
    path, message = case(tmp_path)
    before = _snapshot(tmp_path)
    with pytest.raises(ConfigError, match=f"^cannot write --output {path}: .*{message}") as err:
        mio.check_output(path, what="--output")
    assert "\n" not in str(err.value) and "; " in str(err.value)  # one line, with what to do
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("spelling", ["same", "dot", "link", "hardlink"])
def test_two_outputs_of_one_call_that_are_one_path_are_refused(tmp_path, monkeypatch, spelling):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "o.jsonl").write_text("OLD\n")
    other = {"same": "o.jsonl", "dot": str(tmp_path / "." / "o.jsonl"), "link": "ln.jsonl",
             "hardlink": "hard.jsonl"}[spelling]
    if spelling == "link":
        (tmp_path / "ln.jsonl").symlink_to(tmp_path / "o.jsonl")
    if spelling == "hardlink":
        os.link(tmp_path / "o.jsonl", tmp_path / "hard.jsonl")
    before = _snapshot(tmp_path)
    with pytest.raises(ConfigError, match=r"cannot write --discarded .*: it is also --output \(o\.jsonl\), "
                                          r"another output of the same call; give each output its own path"):
        mio.check_outputs({"--output": "o.jsonl", "--discarded": other, "--report": None})
    assert _snapshot(tmp_path) == before


def test_file_outputs_that_are_fine_pass_and_a_link_is_written_through(tmp_path):
    assert mio.check_output(None) is None
    assert mio.check_output(tmp_path / "new" / "m.json") == tmp_path / "new" / "m.json"
    (tmp_path / "old.json").write_text("{}")
    assert mio.check_output(tmp_path / "old.json") == tmp_path / "old.json"
    (tmp_path / "link.json").symlink_to(tmp_path / "target.json")
    assert mio.check_output(tmp_path / "link.json") == tmp_path / "target.json"
    outputs = {"--output": tmp_path / "a.json", "--plot": tmp_path / "a.png", "--x": None}
    assert mio.check_outputs(outputs) == {"--output": tmp_path / "a.json", "--plot": tmp_path / "a.png"}
    assert not (tmp_path / "new").exists()  # checking writes nothing


# ---------------------------------------------------------------------------------- check_output: folders
def _a_file(tmp_path):
    (tmp_path / "f.txt").write_text("precious")
    return tmp_path / "f.txt", "it is an existing file"


def _another_folder(tmp_path):
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("mine")
    return tmp_path / "keep", "it is a non-empty folder that is not a test artefact; refusing to overwrite it"


def _link_to_another_folder(tmp_path):
    _another_folder(tmp_path)
    (tmp_path / "ln").symlink_to(tmp_path / "keep")
    return tmp_path / "ln", "that is not a test artefact"


def _a_node(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    return tmp_path / "fifo", "it is not a folder"


@pytest.mark.parametrize("case", [_a_file, _another_folder, _link_to_another_folder, _a_node])
def test_a_folder_output_refuses_what_is_not_its_kind(tmp_path, case):
    path, message = case(tmp_path)
    before = _snapshot(tmp_path)
    with pytest.raises(ConfigError, match=f"^cannot write --out {path}: .*{message}"):
        mio.check_output(path, ART, what="--out")
    with pytest.raises(ConfigError, match=message):
        with mio.replace_folder(path, ART) as tmp:
            (tmp / "marker.json").write_text("{}")
    assert _snapshot(tmp_path) == before  # nothing replaced, no hidden leftover


@pytest.mark.parametrize("where", [".", "..", "../.."])
def test_a_folder_output_is_never_the_current_folder_or_one_above(tmp_path, monkeypatch, where):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "marker.json").write_text("{}")  # even a folder of the right kind
    monkeypatch.chdir(tmp_path / "a" / "b")
    with pytest.raises(ConfigError, match="current folder or one above it.*name a new folder below it"):
        mio.check_output(where, ART, what="--output")


def test_folder_outputs_that_are_fine_pass(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "marker.json").write_text("{}")
    (tmp_path / "mine" / "other.bin").write_text("x")
    for name in ("empty", "mine", "new"):
        assert mio.check_output(tmp_path / name, ART) == tmp_path / name
    (tmp_path / "anything").mkdir()
    (tmp_path / "anything" / "x").write_text("x")
    assert mio.check_output(tmp_path / "anything", mio.ANY_FOLDER) == tmp_path / "anything"


# ---------------------------------------------------------------------------------- symlinks, swaps
@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_a_folder_output_that_is_a_symlink_is_written_through(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(mio, "_exchange", lambda a, b: False)
    (tmp_path / "store").mkdir()
    real = tmp_path / "store" / "v1"
    link = tmp_path / "link"
    link.symlink_to(real)
    for version in ("1", "2"):  # first through a dangling link, then over the existing folder
        with mio.replace_folder(link, ART) as tmp:
            (tmp / "marker.json").write_text(version)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert (link / "marker.json").read_text() == "2" and (real / "marker.json").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "store"]
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["v1"]  # no leftover beside the target


def test_swap_in_refuses_a_file_at_the_target(tmp_path):
    (tmp_path / "target").write_text("precious")
    (tmp_path / "new").mkdir()
    with pytest.raises(ConfigError, match="it is not a folder"):
        mio.swap_in(tmp_path / "new", tmp_path / "target")
    assert (tmp_path / "target").read_text() == "precious" and (tmp_path / "new").is_dir()


# ---------------------------------------------------------------------------------- threads
def test_temporary_names_differ_per_thread_and_name_the_process(tmp_path):
    names, threads = [], []
    for _ in range(8):
        t = threading.Thread(target=lambda: names.extend(mio.temp_name(tmp_path / "run") for _ in range(20)))
        threads.append(t)
        t.start()
    for t in threads:
        t.join()
    assert len(set(names)) == 160
    assert all(n.name.startswith(f".run.tmp-{os.getpid()}-") for n in names)
    assert len({n.name.split("-")[2] for n in names}) > 1  # the thread id is part of the name


def test_cleanup_keeps_a_live_threads_folder_and_removes_a_dead_one_of_this_process(tmp_path):
    target = tmp_path / "run"
    dead_own = tmp_path / f".run.tmp-{os.getpid()}-1-deadbeef"  # a failed writer of this process, long gone
    dead_own.mkdir()
    inside, release, seen = threading.Event(), threading.Event(), []

    def writer():
        with mio.replace_folder(target) as tmp:
            (tmp / "part.txt").write_text("from the thread")
            seen.append(tmp)
            inside.set()
            release.wait(30)

    t = threading.Thread(target=writer)
    t.start()
    assert inside.wait(30)
    mio.clean_leftovers(target)  # another thread of the same process (same pid) cleans meanwhile
    with mio.replace_folder(target) as tmp:  # and saves the same target itself
        (tmp / "part.txt").write_text("from the main thread")
    assert seen[0].is_dir() and (seen[0] / "part.txt").read_text() == "from the thread"
    assert not dead_own.exists()
    release.set()
    t.join()
    assert (target / "part.txt").read_text() == "from the thread"  # the last swap wins, complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
def test_threads_saving_one_folder_all_succeed_and_the_folder_is_always_complete(tmp_path, monkeypatch,
                                                                                 exchange):
    if not exchange:
        monkeypatch.setattr(mio, "_exchange", lambda a, b: False)
    target = tmp_path / "model"
    errors, mixes, stop = [], [], threading.Event()

    def writer(n):
        try:
            for i in range(10):
                with mio.replace_folder(target, ART) as tmp:
                    for part in range(3):
                        (tmp / f"part-{part}.txt").write_text(f"{n}-{i}")
                    (tmp / "marker.json").write_text(f"{n}-{i}")
        except Exception as exc:  # noqa: BLE001 - any error is the failure under test
            errors.append(repr(exc))

    def reader():
        while not stop.is_set():
            try:
                before = (target / "marker.json").read_text()
                parts = {(target / f"part-{p}.txt").read_text() for p in range(3)}
                after = (target / "marker.json").read_text()
            except FileNotFoundError:
                continue  # before the first save (or the fallback's brief window)
            if before == after and parts != {before}:
                mixes.append((before, parts))

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert errors == [] and mixes == []
    final = (target / "marker.json").read_text()
    assert {(target / f"part-{p}.txt").read_text() for p in range(3)} == {final}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
