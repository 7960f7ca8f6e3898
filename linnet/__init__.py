"""Linnet: one checked tensor-language source per model, many backends and formats."""

from linnet.errors import (
    CheckpointError,
    ConfigError,
    LinnetError,
    PickledCheckpoint,
    RuntimeGuardError,
    SourceError,
    UnsupportedArchitecture,
)

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "ConfigError",
    "LinnetError",
    "PickledCheckpoint",
    "RuntimeGuardError",
    "SourceError",
    "UnsupportedArchitecture",
]
