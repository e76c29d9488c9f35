"""How every file of the project is written (whole or not at all) and read (or refused in one sentence).

Run records, calibration files, traces, pictures and reports are read by other processes (a
notebook polling a run directory, a validation reading ``run.json``), so a reader must never
see half a file, and a writer must never damage what it does not own.  Every output goes
through :func:`atomic_output` (or :func:`write_json_atomic`, :func:`write_text_atomic`,
:func:`write_bytes_atomic` on top of it), which keeps these rules:

* the target, when it exists, must be a regular file: a directory, a symbolic link, a
  device or a FIFO is refused (:class:`OutputPathError`), because renaming over it would
  replace the link or the device node instead of writing where the user meant;
* a missing parent directory is created (for files the program lays out itself; a path a
  user names is checked first by :func:`check_named_output`, which refuses a directory that is
  not there rather than create it);
* the bytes go to a temporary file beside the target, created exclusively and without
  following symbolic links, flushed and synced to disk, then renamed over the target in one
  step: a reader sees the old file or the new one;
* the new file gets the permissions of the file it replaces, or ``0o666`` less the umask for
  a new one, like any file a program creates (a temporary file starts private);
* on any failure (full disk, read-only file system, permission denied...) the temporary file
  is removed and the error becomes one sentence naming the path and what to do.

Inputs are read through :func:`read_text_input`, which refuses a missing path, a directory
or an unreadable file with one sentence (:class:`InputPathError`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


class OutputPathError(ValueError):
    """An output file that cannot be written where asked; the message is one sentence saying what to do."""


class InputPathError(ValueError):
    """An input file that cannot be read; the message is one sentence saying what to do."""


# What an errno means to someone choosing a path, and what they can do about it.
_ERRNO_WORDS = {
    errno.ENOSPC: "no space left on device; free space or choose another path",
    errno.EDQUOT: "disk quota exceeded; free space or choose another path",
    errno.EROFS: "the file system is read-only; choose another path",
    errno.EACCES: "permission denied; choose a path you can write to",
    errno.EPERM: "operation not permitted; choose a path you can write to",
    errno.EISDIR: "it is a directory; give a file name",
    errno.ENOTDIR: "a part of the path is not a directory; choose another path",
    errno.EEXIST: "a part of the path exists and is not a directory; choose another path",
    errno.ENOENT: "a directory on the path does not exist (or vanished while writing); choose another path",
    errno.ENAMETOOLONG: "the name is too long; choose a shorter path",
    errno.ELOOP: "too many symbolic links on the path; choose another path",
    errno.EIO: "an input/output error occurred, the disk may be failing; choose another path",
    errno.EMFILE: "too many open files; close some and try again",
    errno.ENFILE: "too many open files on the system; try again later",
    errno.EBUSY: "the file is busy; try again or choose another path",
    errno.ETXTBSY: "the file is busy; try again or choose another path",
    errno.EFBIG: "the file is too large for this file system; choose another path",
}


def _words(exc: OSError) -> str:
    if exc.errno in _ERRNO_WORDS:
        return _ERRNO_WORDS[exc.errno]
    return f"{(exc.strerror or type(exc).__name__).lower()}; choose another path"


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _existing_mode(path: Path) -> int | None:
    """The permission bits of the regular file at ``path``, None when nothing is there.

    ``lstat``, not ``stat``: a symbolic link is judged as itself, never as what it points to."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OutputPathError(f"cannot write {path}: {_words(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise OutputPathError(f"cannot write {path}: it is {_kind(st.st_mode)}, not a regular file; "
                              f"choose another path")
    return stat.S_IMODE(st.st_mode)


def check_output_path(path: str | os.PathLike) -> Path:
    """Refuse, before any work is done, a target that :func:`atomic_output` would refuse; returns it."""
    path = Path(path)
    _existing_mode(path)
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if parent.exists() and not parent.is_dir():
        raise OutputPathError(f"cannot write {path}: {parent} is not a directory; choose another path")
    return path


def check_named_output(path: str | os.PathLike, directory: bool = False) -> Path:
    """The rule for every output path a user names on a command line, checked before any work.

    What :func:`check_output_path` refuses, and a directory that is not there: a typo in a
    directory name is a bad path like any other, refused in one sentence rather than created.
    ``directory=True`` names a directory to write into (``demo --out``, ``--trace-dir``): that one
    directory is created when writing, but the directory holding it must exist.  Returns ``path``."""
    path = Path(path)
    if directory and path.exists() and not path.is_dir():
        raise OutputPathError(f"cannot write into {path}: it is not a directory; choose another path")
    if not directory:
        check_output_path(path)
    if not path.parent.is_dir():
        raise OutputPathError(f"cannot write {path}: the directory {path.parent} does not exist; "
                              f"create it or choose another path")
    return path


def _umask() -> int:
    """The process's umask, read without changing it where the system says (``os.umask`` sets it
    while reading it, which another thread creating a file at that moment would see)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _sync_directory(directory: Path) -> None:
    """Make the rename itself durable; file systems that cannot sync a directory are let be."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(tmp: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """A file object whose contents replace ``path`` when the ``with`` block ends without error.

    ``mode`` is ``"wb"`` or ``"w"`` (text, UTF-8).  Nothing is left at ``path`` or beside it when
    the block or the write fails; an :class:`OSError` becomes an :class:`OutputPathError`."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_output writes a whole new file: mode must be 'w' or 'wb', not {mode!r}")
    path = Path(path)
    keep_mode = _existing_mode(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # mkstemp opens with O_CREAT | O_EXCL | O_NOFOLLOW: a fresh file of ours, never a link.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise OutputPathError(f"cannot write {path}: {_words(exc)}") from None
    try:
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), keep_mode if keep_mode is not None else 0o666 & ~_umask())
        # Checked again just before the rename: something may have appeared there meanwhile.
        _existing_mode(path)
        os.replace(tmp, path)
    except OSError as exc:
        _remove(tmp)
        raise OutputPathError(f"cannot write {path}: {_words(exc)}") from None
    except BaseException:
        _remove(tmp)
        raise
    _sync_directory(path.parent)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (see :func:`atomic_output`)."""
    with atomic_output(path, "wb") as f:
        f.write(data)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all (see :func:`atomic_output`)."""
    with atomic_output(path, "w") as f:
        f.write(text)


def write_json_atomic(path, obj, **dump_kwargs) -> None:
    """Write ``obj`` as JSON to ``path`` whole or not at all: a reader sees the old file or the new
    one, never a half-written one (see :func:`atomic_output`)."""
    with atomic_output(path, "w") as f:
        json.dump(obj, f, **dump_kwargs)


def read_text_input(path: str | os.PathLike, what: str = "file") -> str:
    """The text of the regular file at ``path`` (undecodable bytes replaced); anything else is one
    sentence naming ``what`` the file was meant to be."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputPathError(f"{what} {str(path)!r} does not exist; check the path") from None
    except OSError as exc:
        raise InputPathError(f"cannot read {what} {str(path)!r}: {_read_words(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputPathError(f"{what} {str(path)!r} is {_kind(st.st_mode)}, not a regular file; "
                             f"pass the path of a file")
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputPathError(f"cannot read {what} {str(path)!r}: {_read_words(exc)}") from None


def _read_words(exc: OSError) -> str:
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied; make it readable or copy it somewhere you can read"
    return (exc.strerror or type(exc).__name__).lower() + "; check the path"
