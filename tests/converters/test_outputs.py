"""Outputs the system refuses end in one error naming the target (exit 1, no traceback, no
partial file), and a write killed earlier leaves nothing that a later run does not remove."""

from __future__ import annotations

import errno
import os
import shutil

import pytest
from click.testing import CliRunner

from linnet.atomic import OutputError, atomic_path
from linnet.cli import main


def export_hf(src, out):
    return CliRunner().invoke(main, ["export", "hf", str(src), "--out", str(out)])


def test_a_parent_that_is_a_file(tiny_checkpoint, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    done = export_hf(tiny_checkpoint("LlamaForCausalLM"), tmp_path / "file" / "out")
    assert done.exit_code == 1, done.output
    assert "file/out: cannot write it" in done.output and "Traceback" not in done.output


@pytest.mark.parametrize("is_dir", [True, False])
def test_a_full_disk_is_named_and_leaves_nothing(tmp_path, is_dir):
    final = tmp_path / "out"
    with pytest.raises(OutputError, match="out: cannot write it: No space left on device"):
        with atomic_path(final, is_dir=is_dir) as tmp:
            (tmp / "w" if is_dir else tmp).write_bytes(b"x")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_read_only_folder(tmp_path, monkeypatch):
    """(As root nothing is read-only, so the refusal is the system's answer made up here.)"""

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path / "out"))

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OutputError, match="cannot write it: Permission denied"):
        with atomic_path(tmp_path / "out") as tmp:
            tmp.write_bytes(b"x")
    assert list(tmp_path.iterdir()) == []


def test_an_input_error_inside_the_block_stays_itself(tmp_path):
    with pytest.raises(FileNotFoundError):
        with atomic_path(tmp_path / "out"):
            (tmp_path / "elsewhere" / "input.bin").read_bytes()


def test_temporaries_of_a_killed_write_are_removed_by_the_next(tiny_checkpoint, tmp_path):
    stale = tmp_path / ".out.partial-999999999-abcdef"  # no process has this pid
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    live = tmp_path / f".out.partial-{os.getppid()}-abcdef"  # a running process's: kept
    live.mkdir()
    done = export_hf(tiny_checkpoint("LlamaForCausalLM"), tmp_path / "out")
    assert done.exit_code == 0, done.output
    assert not stale.exists() and live.exists()
    shutil.rmtree(live)
