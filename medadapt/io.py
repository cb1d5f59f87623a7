"""Atomic writes and the one output policy of medadapt.

Files are written to a temporary name in the same folder, fsynced and renamed (:func:`atomic_open`); folders
are written beside their target and swapped in whole (:func:`swap_in`), with the mode a plain ``open()``
gives. :func:`check_output` is the policy every writer follows (no file over a folder or device, no
non-empty folder of another kind replaced, no two outputs on one path, symlinks written through); temporary
names are unique per process and thread and cleanup spares live writers. See docs/guarantees.md.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import stat
import tempfile
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from medadapt.errors import ConfigError, MedAdaptError
from medadapt.locks import path_lock


_UMASK_LOCK = threading.Lock()


def file_mode() -> int:
    """``0o666`` less the process umask: the mode ``open()`` would give a new file (``mkstemp`` gives 0600)."""
    with _UMASK_LOCK:  # reading the umask means setting it; no other thread may see the temporary value
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing, renamed onto ``path`` only on success, with the
    mode a plain ``open()`` gives; a folder at ``path`` or an unwritable place is a :class:`MedAdaptError`."""
    path = _real(Path(path))  # write through a link (replacing it would leave its target untouched)
    problem = _file_problem(path)  # the output policy's file rules (check_output), at write time
    if problem is not None:
        raise MedAdaptError(f"cannot write {path}: {problem[0]}; {problem[1]}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise MedAdaptError(f"cannot write {path}: {exc.strerror or exc}") from None
    binary = "b" in mode
    try:
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as f:
            os.fchmod(f.fileno(), file_mode())  # the user's usual permissions, not mkstemp's owner-only 0600
            yield f
            f.flush()
            os.fsync(f.fileno())
        try:
            os.replace(tmp, path)
        except OSError as exc:  # e.g. ``path`` became a folder meanwhile
            raise MedAdaptError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> None:
    """Write ``obj`` as standard JSON atomically; ``NaN`` / ``Infinity`` (not JSON) are a :class:`MedAdaptError`."""
    try:
        text = json.dumps(obj, indent=indent, ensure_ascii=False, sort_keys=False, allow_nan=False)
    except ValueError as exc:  # NaN / inf (allow_nan=False), circular references
        raise MedAdaptError(f"cannot write {path}: {exc} (JSON has no NaN or infinity)"
                            if "float" in str(exc) else f"cannot write {path}: {exc}") from None
    atomic_write_text(path, text + "\n")


def atomic_save_tensors(path: str | os.PathLike, tensors: dict, metadata: dict[str, str] | None = None) -> None:
    """Save ``{name: torch.Tensor}`` as a safetensors file atomically, with the usual file mode (safetensors'
    own ``save_file`` creates owner-only 0600 files). Tensors are copied to contiguous CPU memory first."""
    from safetensors.torch import save

    data = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, metadata=metadata)
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_save_npy(path: str | os.PathLike, array) -> None:
    """Save a numpy array as ``.npy`` atomically (``allow_pickle`` is never used)."""
    import numpy as np

    with atomic_open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux ``renameat2(RENAME_EXCHANGE)``); ``False`` where the
    platform or file system cannot, so the caller falls back to two renames."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(a))


def swap_in(new: Path, target: Path) -> None:
    """Put folder ``new`` at ``target`` (a symlink is written through), replacing any folder there whole.

    On Linux the two are exchanged atomically: a reader finds the old or the new folder, never none or a
    mix. Elsewhere the old one is renamed away first (a crash then leaves ``.<name>.old-*``, which
    :func:`clean_leftovers` puts back). Threads take turns per target; a file at ``target`` is a
    :class:`ConfigError`. Hand-written: no library swaps directories.
    """
    new, target = Path(new), _real(Path(target))
    normalize_modes(new)  # what other libraries wrote into it gets the mode open() gives
    _sync_tree(new)  # the new folder's bytes are on disk before any name points at it
    with path_lock(target):
        try:
            if target.exists() and not target.is_dir():
                raise ConfigError(f"cannot write {target}: it is not a folder; give a new or empty folder "
                                  "(it is left as it is)")
            if not target.exists():
                try:
                    os.replace(new, target)
                    return
                except OSError as exc:  # another process put a folder there meanwhile: exchange with it
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target.is_dir():
                        raise
            if _exchange(new, target):  # ``new`` now holds the old folder
                shutil.rmtree(new, ignore_errors=True)
                return
            old = temp_name(target, "old")
            with live(old):
                os.replace(target, old)
                os.replace(new, target)
                shutil.rmtree(old, ignore_errors=True)
        finally:
            _sync_dir(target.parent)


def normalize_modes(folder: str | os.PathLike) -> None:
    """Give every regular file under ``folder`` (not symlinks) the mode a plain ``open()`` gives."""
    mode = file_mode()
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != mode:
                os.chmod(path, mode)


def _sync_dir(path: str | os.PathLike) -> None:
    """fsync a file or a directory (renames into it); a no-op where it cannot be opened or synced."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sync_tree(folder: Path) -> None:
    """fsync everything under ``folder`` (``save_pretrained`` does not), so a power loss right after the
    swap cannot leave the new name over unwritten data."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            _sync_dir(os.path.join(root, name))
        _sync_dir(root)


def _label(path: str | os.PathLike, what: str = "") -> str:
    return f"{what} {path}" if what else str(path)


def _writable_problem(path: Path) -> str | None:
    """Why nothing can be created at ``path``, or ``None``: a temporary file is tried in the nearest existing
    folder (``os.access`` says yes to root everywhere, even on ``/proc``)."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


# ------------------------------------------------------------------------------------------ output policy
@dataclass(frozen=True)
class FolderKind:
    """A kind of folder output written whole (a run, an index, an adapter): a non-empty folder is replaced
    only when it holds one of ``markers`` (``None``: any folder, for folders medadapt names itself)."""

    description: str
    markers: tuple[str, ...] | None = None

    def holds(self, folder: Path) -> bool:
        return self.markers is None or any((folder / m).is_file() for m in self.markers)


#: A single file written atomically (:func:`atomic_open`).
FILE = "file"
#: Any folder (no check of what it holds): for folders medadapt names itself, never a user's path.
ANY_FOLDER = FolderKind("a folder")


def _real(path: Path) -> Path:
    """``path``, or where it points when it is a symlink (outputs are written through links)."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _same_path(a: Path, b: Path) -> bool:
    """The same file or folder (after links, ``.`` and ``..``), existing or not."""
    try:
        if os.path.samefile(a, b):
            return True
    except OSError:  # one of them does not exist (yet)
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def _file_problem(real: Path) -> tuple[str, str] | None:
    """``(reason, advice)`` when ``real`` (links followed) cannot be replaced by a file, else ``None``."""
    if real.is_dir():
        return "it is an existing folder", "give a file path"
    if real.exists() and not real.is_file():  # a device, a FIFO, a socket: renaming over it would destroy it
        return "it is not a regular file (a device, FIFO or socket)", "give the path of a regular file"
    return None


def _folder_problem(real: Path, kind: FolderKind) -> tuple[str, str] | None:
    """``(reason, advice)`` when ``real`` cannot be replaced whole by a folder of ``kind``, else ``None``."""
    if real.exists() and not real.is_dir():
        what = "an existing file" if real.is_file() else "not a folder (a device, FIFO or socket)"
        return f"it is {what}", "give a new or empty folder (it is left as it is)"
    absolute = real.resolve()
    if absolute in (Path.cwd().resolve(), *Path.cwd().resolve().parents):
        return ("it is the current folder or one above it, and a folder output is replaced as a whole",
                "name a new folder below it (e.g. runs/NAME)")
    if real.is_dir() and not kind.holds(real) and any(real.iterdir()):
        return (f"it is a non-empty folder that is not {kind.description}",
                "refusing to overwrite it: give a new or empty folder (nothing in it was changed)")
    return None


def _named_others(others: Mapping[str, Any] | Iterable[Any]) -> list[tuple[str, Any]]:
    if isinstance(others, Mapping):
        return list(others.items())
    return [("", other) for other in others]


def check_output(path: str | os.PathLike | None, kind: str | FolderKind = FILE, *, what: str = "",
                 others: Mapping[str, Any] | Iterable[Any] = ()) -> Path | None:
    """The output policy of every medadapt writer, applied before any work: the path to write to (a
    symlink resolved), or ``None`` for ``None``. ``kind``: :data:`FILE` or a :class:`FolderKind`.

    A :class:`ConfigError` (``cannot write [WHAT ]PATH: <reason>; <what to do>``) when ``path`` is also one
    of ``others`` (the call's other outputs, named by a mapping or plain); a file over a folder, device,
    FIFO or socket; a folder over a file, over the current folder or one above it, or over a non-empty
    folder not of ``kind``; or a place that takes no new file.
    """
    if not isinstance(kind, FolderKind) and kind != FILE:
        raise ValueError(f"kind must be FILE or a FolderKind, got {kind!r}")
    if path is None:
        return None
    given = Path(path)
    label = _label(given, what)
    for other_what, other in _named_others(others):
        if other is not None and _same_path(given, Path(other)):
            other_label = f"{other_what} ({other})" if other_what else str(other)
            raise ConfigError(f"cannot write {label}: it is also {other_label}, another output of the same "
                              "call; give each output its own path")
    try:
        real = _real(given)
        problem = _folder_problem(real, kind) if isinstance(kind, FolderKind) else _file_problem(real)
        if problem is None:
            writable = _writable_problem(real)
            problem = None if writable is None else (writable, "choose a place you can write")
    except OSError as exc:  # a symlink loop, a folder that cannot be listed
        problem = (exc.strerror or str(exc), "choose another path")
    if problem is not None:
        raise ConfigError(f"cannot write {label}: {problem[0]}; {problem[1]}")
    return real


def check_outputs(outputs: Mapping[str, str | os.PathLike | None], kind: str | FolderKind = FILE) -> dict:
    """:func:`check_output` for every output of one call (``{"--output": path, "--report": None}``), each
    against the others; ``{name: path to write}`` for those given."""
    checked: dict[str, Path] = {}
    for name, path in outputs.items():
        if path is not None:  # compared with those before it: the error names the later one
            checked[name] = check_output(path, kind, what=name, others={n: outputs[n] for n in checked})
    return checked


# ------------------------------------------------------------------------------ temporary names, leftovers
_LIVE: set[str] = set()  # absolute paths of this process's temporary folders being written right now
_LIVE_LOCK = threading.Lock()


def temp_name(target: Path, kind: str = "tmp") -> Path:
    """A name beside ``target`` no other writer uses: ``.<name>.<kind>-<pid>-<thread id>-<random>``."""
    target = Path(os.path.abspath(target))
    return target.parent / (f".{target.name}.{kind}-{os.getpid()}-{threading.get_native_id()}-"
                            f"{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def live(path: Path) -> Iterator[Path]:
    """Mark ``path`` as being written while the block runs: :func:`clean_leftovers` leaves it alone."""
    key = os.path.abspath(path)
    with _LIVE_LOCK:
        _LIVE.add(key)
    try:
        yield path
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(key)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_pid(rest: str) -> int | None:
    """The process id in what follows ``.<name>.<kind>-`` (``<pid>-...``)."""
    first = rest.split("-", 1)[0]
    return int(first) if first.isdigit() else None


def _in_use(leftover: Path, rest: str, own: bool) -> bool:
    with _LIVE_LOCK:
        if os.path.abspath(leftover) in _LIVE:
            return True  # a thread of this process is writing it
    pid = _owner_pid(rest)
    if pid is None:
        return False
    if pid == os.getpid():
        return not own  # ours and held by no thread of ours: an earlier failure's (kept when own=False)
    return _pid_alive(pid)  # another process's: kept while it runs


def clean_leftovers(target: Path, own: bool = True) -> None:
    """Remove what an interrupted :func:`replace_folder` / :func:`swap_in` left beside ``target``
    (``.<name>.tmp-*``, ``.<name>.old-*``) unless a live writer (another running process, a :func:`live`
    thread; with ``own=False`` any of this process) holds it; an old folder comes back if ``target`` is
    missing (a crash between the fallback's two renames)."""
    target = _real(Path(target))
    with path_lock(target):
        for kind in ("old", "tmp"):
            prefix = f".{target.name}.{kind}-"
            for leftover in sorted(target.parent.glob(glob.escape(prefix) + "*")):
                if _in_use(leftover, leftover.name[len(prefix):], own):
                    continue
                if kind == "old" and not target.exists():
                    os.replace(leftover, target)
                else:
                    shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def replace_folder(target: str | os.PathLike, kind: FolderKind = ANY_FOLDER, *,
                   what: str = "") -> Iterator[Path]:
    """Yield a temporary sibling folder to write into; on success it replaces ``target`` whole
    (:func:`swap_in`: a reader sees the old or the new folder, never a mix), on failure it is deleted.

    ``target`` is checked with :func:`check_output` before and again just before the swap; earlier
    leftovers are cleaned first; threads writing one target each write their own folder and swap in turn
    (the last one wins).
    """
    real = Path(os.path.abspath(check_output(target, kind, what=what)))
    real.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(real)
    with live(tmp):
        clean_leftovers(real)
        tmp.mkdir()
        try:
            yield tmp
            with path_lock(real):
                problem = _folder_problem(real, kind)  # something else put there while this one wrote
                if problem is not None:
                    raise ConfigError(f"cannot write {_label(target, what)}: {problem[0]}; {problem[1]}")
                swap_in(tmp, real)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # the new folder, or after an exchange the old one
            raise
