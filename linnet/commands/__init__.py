"""CLI commands beyond check and plan, one module per area (zoo, run/parity, export, push)."""
