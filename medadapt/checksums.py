"""``SHA256SUMS`` files: the SHA-256 of the files a folder's reader will load, checked before any is used.

``sha256sum`` format (``<hex>  <relative path>``), so ``sha256sum -c SHA256SUMS`` works by hand. A reader names
the files it will load (``cover``) or asks that every file be listed (``complete``), so a damaged sums file
fails too. Catches accidents (truncation, bit rot, a half-copied folder), not a deliberate rewrite.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from medadapt.errors import MedAdaptError
from medadapt.identity import sha256_file
from medadapt.io import atomic_write_text

__all__ = ["SUMS", "ChecksumError", "read_sums", "verify_sums", "write_sums"]

#: Default name of the sums file in a folder.
SUMS = "SHA256SUMS"


class ChecksumError(MedAdaptError):
    """A folder's files do not match its sums file (missing, unlisted, changed), or it has none."""


def _files(folder: Path, sums: str) -> list[str]:
    """Every regular file under ``folder`` (relative POSIX paths) except the sums file itself."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if p.is_file() and p.relative_to(folder).as_posix() != sums)


def write_sums(folder: str | Path, names: Iterable[str] | None = None, *, name: str = SUMS) -> dict[str, str]:
    """Write ``folder/name`` listing ``names`` (default: every file under ``folder``) with their SHA-256,
    atomically. Returns ``{relative path: digest}``."""
    folder = Path(folder)
    listed = sorted(set(names)) if names is not None else _files(folder, name)
    sums = {n: sha256_file(folder / n) for n in listed}
    atomic_write_text(folder / name, "".join(f"{d}  {n}\n" for n, d in sums.items()))
    return sums


def read_sums(folder: str | Path, *, name: str = SUMS) -> dict[str, str]:
    """Parse ``folder/name``; a missing, unreadable or malformed file, or a path leaving the folder, is a
    :class:`ChecksumError`."""
    path = Path(folder) / name
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ChecksumError(f"{path.parent}: {name} is missing") from None
    except (OSError, ValueError) as exc:
        raise ChecksumError(f"{path}: cannot read ({exc})") from None
    sums: dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        digest, sep, rel = line.partition("  ")
        digest = digest.lower()
        p = PurePosixPath(rel)
        if (not sep or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest) or not rel
                or p.is_absolute() or ".." in p.parts or rel in sums):
            raise ChecksumError(f"{path}:{i}: not a '<sha256>  <file>' line of this folder")
        sums[rel] = digest
    return sums


def verify_sums(folder: str | Path, *, cover: Iterable[str] = (), complete: bool = False,
                name: str = SUMS) -> dict[str, str]:
    """Check ``folder`` against its sums file before anything in it is read: every listed file present and
    unchanged, every ``cover`` file (the ones the caller will load) listed, and with ``complete`` every file
    under ``folder`` listed; else :class:`ChecksumError`."""
    folder = Path(folder)
    sums = read_sums(folder, name=name)
    unlisted = [n for n in cover if n not in sums]
    if complete:
        unlisted += [n for n in _files(folder, name) if n not in sums and n not in unlisted]
    if unlisted:
        raise ChecksumError(f"{folder}: {', '.join(unlisted[:3])} not listed in {name}; the folder is "
                            "incomplete or was modified")
    for rel, digest in sums.items():
        f = folder / rel
        if not f.is_file():
            raise ChecksumError(f"{folder}: {rel} is missing (listed in {name})")
        if sha256_file(f) != digest:
            raise ChecksumError(f"{f}: checksum differs from {name} (the file is truncated or was modified)")
    return sums
