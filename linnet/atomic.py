"""Atomic writes: build under a temporary name beside the target, rename at the end.

    with atomic_path(out_dir, is_dir=True, overwrite=False) as tmp:
        ...write everything under tmp...
    # out_dir now exists, complete; an exception (or a kill) leaves nothing under out_dir

The temporary name is hidden (`.NAME.partial-PID-XXXX`) in the target's folder, so the
rename never crosses a filesystem. An interrupted write leaves only that temporary,
never a file under the final name that looks complete; the next write to the same target
removes the temporaries of processes that are gone. A write the system refuses (a
read-only folder, a parent that is a file, a full disk) is an `OutputError` naming the
target, not an OSError traceback.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from linnet.errors import LinnetError

PARTIAL = ".partial-"


class OutputError(LinnetError):
    """The system refused to write an output: the target and the reason."""


def _output_error(final: Path, err: OSError) -> OutputError:
    return OutputError(f"{final}: cannot write it: {err.strerror or err}")


def _is_output(err: OSError, final: Path, tmp: Path) -> bool:
    """An OSError about the output (a write has no file name; a path under the target's
    folder), not about an input the block was reading."""
    if err.filename is None:
        return True
    name = Path(os.fsdecode(err.filename))
    return name == final or name.is_relative_to(tmp) or name.parent == final.parent


def temp_name(final: Path) -> Path:
    return final.parent / f".{final.name}{PARTIAL}{os.getpid()}-{secrets.token_hex(3)}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_stale(final: Path) -> None:
    """Temporaries of `final` left by processes that are gone (a kill mid-write)."""
    prefix = f".{final.name}{PARTIAL}"
    for path in final.parent.glob(f"{prefix}*"):
        pid = path.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def check_target(final: Path, *, is_dir: bool, overwrite: bool) -> None:
    """Refuse an existing target unless `overwrite` (an empty folder never counts)."""
    if not (final.exists() or final.is_symlink()):
        return
    if is_dir and final.is_dir() and not any(final.iterdir()):
        return
    if not overwrite:
        raise LinnetError(f"{final} already exists; choose another name or overwrite it")
    if final.is_dir() != is_dir:
        kind = "a folder" if final.is_dir() else "a file"
        raise LinnetError(f"{final} is {kind}; will not replace it")


@contextmanager
def atomic_path(
    final: str | Path, *, is_dir: bool = False, overwrite: bool = False
) -> Iterator[Path]:
    """Yield a temporary path (a created folder if `is_dir`) that becomes `final` when the
    block ends without an exception; otherwise the temporary is removed."""
    final = Path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        check_target(final, is_dir=is_dir, overwrite=overwrite)
        remove_stale(final)
        tmp = temp_name(final)
        if is_dir:
            tmp.mkdir()
    except OSError as err:
        raise _output_error(final, err) from err
    try:
        yield tmp
        if is_dir:
            os.chmod(tmp, 0o755)
            _replace_dir(tmp, final)
        else:
            os.replace(tmp, final)
    except OSError as err:
        _remove(tmp)
        if not _is_output(err, final, tmp):
            raise
        raise _output_error(final, err) from err
    except BaseException:
        _remove(tmp)
        raise


def _replace_dir(tmp: Path, final: Path) -> None:
    if not final.exists():
        os.rename(tmp, final)
        return
    old = temp_name(final)
    os.rename(final, old)  # an empty folder, or overwrite was allowed
    try:
        os.rename(tmp, final)
    except BaseException:
        os.rename(old, final)
        raise
    _remove(old)
