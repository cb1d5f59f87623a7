"""Atomic file writes: write to a temporary file in the same directory, fsync, then ``os.replace``.

A killed process therefore leaves either the old file or the new one, never a half-written file.
Hand-written because the standard library has no one-call atomic write.

Every file medadapt publishes gets the mode a plain ``open()`` gives (``0o666`` less the umask): single files
through :func:`atomic_open`, and every file of a folder swapped in by :func:`swap_in` (libraries that write
into those folders, e.g. safetensors' ``save_file`` behind ``save_pretrained``, create owner-only 0600 files).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


_UMASK_LOCK = threading.Lock()


def file_mode() -> int:
    """``0o666`` less the process umask: the mode ``open()`` would give a new file (``mkstemp`` gives 0600)."""
    with _UMASK_LOCK:  # reading the umask means setting it; no other thread may see the temporary value
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing; rename it onto ``path`` only on success. The file
    gets the mode a plain ``open()`` would (``0o666`` less the umask).

    Raises:
        MedAdaptError: ``path`` is an existing folder, or its folder cannot be created / written
            (``cannot write PATH: <reason>``), or the final rename fails.
    """
    from medadapt.errors import MedAdaptError

    path = Path(path)
    if path.is_symlink():  # write through the link (replacing it would leave its target untouched)
        path = path.resolve()
    if path.is_dir():
        raise MedAdaptError(f"cannot write {path}: it is an existing folder (give a file path)")
    if path.exists() and not path.is_file():  # a device, a FIFO, a socket: renaming over it would destroy it
        raise MedAdaptError(f"cannot write {path}: it is not a regular file")
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
    """Write ``obj`` as standard JSON (``NaN`` / ``Infinity`` are refused: they are not JSON) atomically.

    Raises:
        MedAdaptError: a non-finite float (naming the file), or see :func:`atomic_open`.
    """
    from medadapt.errors import MedAdaptError

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
    import errno

    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(a))


def swap_in(new: Path, target: Path) -> None:
    """Put folder ``new`` at ``target``, replacing any folder there as a whole, then delete the old one.

    Where the OS can exchange two paths atomically (Linux), a reader at any instant finds the old folder or
    the new one at ``target``, never no folder and never a mix. Elsewhere the old folder is renamed away
    first (a brief window with no folder; a crash in it leaves ``.<name>.old-*``, which
    :func:`clean_leftovers` puts back). Hand-written: no library swaps directories."""
    new, target = Path(new), Path(target)
    normalize_modes(new)  # what other libraries wrote into it gets the mode open() gives
    _sync_tree(new)  # the new folder's bytes are on disk before any name points at it
    try:
        if not target.exists():
            os.replace(new, target)
            return
        if _exchange(new, target):  # ``new`` now holds the old folder
            shutil.rmtree(new, ignore_errors=True)
            return
        old = target.parent / f".{target.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.replace(target, old)
        os.replace(new, target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        _sync_dir(target.parent)


def normalize_modes(folder: str | os.PathLike) -> None:
    """Give every regular file under ``folder`` the mode a plain ``open()`` gives (:func:`file_mode`).
    Symlinks are left alone."""
    mode = file_mode()
    for root, _dirs, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != mode:
                os.chmod(path, mode)


def _sync_dir(path: str | os.PathLike) -> None:
    """fsync a file or a directory (a directory's entries: renames into it); a no-op where it cannot be
    opened or synced."""
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
    """fsync every file and folder under ``folder`` (writers such as ``save_pretrained`` or safetensors
    do not), so a power loss right after the swap cannot leave the new name over unwritten data."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            _sync_dir(os.path.join(root, name))
        _sync_dir(root)


def check_writable(path: str | os.PathLike, what: str = "") -> None:
    """Refuse, before any work, a path that cannot be created: a file on the way, or a folder that takes no
    new file. ``os.access`` is not asked (it says yes to root everywhere, even on ``/proc``): a temporary
    file is created and removed in the nearest existing folder.

    Raises:
        MedAdaptError: ``cannot write [WHAT ]PATH: <reason>``.
    """
    from medadapt.errors import MedAdaptError

    path = Path(path)
    name = f"{what} {path}" if what else str(path)
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise MedAdaptError(f"cannot write {name}: {folder} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise MedAdaptError(f"cannot write {name}: {exc.strerror or exc}") from None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_pid(leftover: Path) -> int | None:
    parts = leftover.name.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def clean_leftovers(target: Path, own: bool = True) -> None:
    """Remove what an interrupted :func:`replace_folder` / :func:`swap_in` left beside ``target``
    (``.<name>.tmp-*``, ``.<name>.old-*``) when the process that made it is gone; an old folder comes back
    to ``target`` if ``target`` is missing (a crash between the two renames of the fallback path).
    ``own=False`` keeps this process's own leftovers too (other threads of it may be writing them)."""
    target = Path(target)
    for kind in ("old", "tmp"):
        for leftover in sorted(target.parent.glob(f".{target.name}.{kind}-*")):
            pid = _owner_pid(leftover)
            if pid is not None and (pid != os.getpid() or not own) and _pid_alive(pid):
                continue  # another process (or thread) is writing right now
            if kind == "old" and not target.exists():
                os.replace(leftover, target)
            else:
                shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def replace_folder(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to write into; on success it replaces ``target`` as a whole
    (:func:`swap_in`), so a crash or a reader sees the old or the new folder, never a mix; on failure the
    temporary folder is deleted and ``target`` is untouched. Leftovers of an earlier crash are cleaned first."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(target)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # the new folder, or after an exchange the old one
        raise
