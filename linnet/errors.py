"""Linnet's own exceptions: every mistake a user can make ends in one of these.

The CLI turns them into a message and an exit code; a Python traceback means a
bug in Linnet, never a bad source or a bad checkpoint.
"""

from __future__ import annotations


class LinnetError(Exception):
    """Base class for every error Linnet reports to a user."""


class SourceError(LinnetError):
    """A `.linnet` source has mistakes; `diagnostics` holds each one."""

    def __init__(self, diagnostics: list) -> None:
        self.diagnostics = list(diagnostics)
        super().__init__("\n\n".join(d.render() for d in self.diagnostics))


class ConfigError(LinnetError):
    """A config value breaks a constraint of the source (`require`) or has the wrong type."""


class CheckpointError(LinnetError):
    """A checkpoint does not fit: names the tensor and/or the file at fault."""

    def __init__(self, message: str, *, tensor: str | None = None, file: str | None = None):
        self.tensor = tensor
        self.file = file
        super().__init__(message)


class UnsupportedArchitecture(CheckpointError):
    """config.json names an architecture no weights map covers."""


class PickledCheckpoint(CheckpointError):
    """The folder only holds pickled weights (.bin/.pt), which Linnet never unpickles."""


class RemoteCode(CheckpointError):
    """A checkpoint asks transformers to import code it ships (`auto_map`): never run."""


class RuntimeGuardError(LinnetError):
    """A `require` that could not be proven at check time failed at run time."""


class AudioError(LinnetError):
    """Audio Linnet cannot use: not audio, empty, or at a sample rate it cannot take."""
