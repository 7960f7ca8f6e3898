"""The torch backend: see docs/architecture.md."""
