"""A planned zoo entry (a name Linnet reserves before it has a source) is refused by a pull
with its reason, before the Hub is contacted. The zoo's own list has no planned entry left
(SAM, the last, became ready in issue 15), so the registry here is a file of its own."""

from __future__ import annotations

import pytest

from linnet.hub import HubError, pull
from zoo.registry import REVISIONS_FILE, load_registry

PLANNED = """
[planned."falcon-7b"]
repo = "tiiuae/falcon-7b"
architecture = "FalconForCausalLM"
needs = "parallel attention and MLP, ALiBi-free rotary"
license = "apache-2.0"
"""


def test_a_planned_entry_is_refused_with_what_it_needs(tmp_path):
    entries = tmp_path / "entries.toml"
    entries.write_text(PLANNED)
    registry = load_registry(entries, REVISIONS_FILE)
    assert [e.name for e in registry.planned()] == ["falcon-7b"]
    with pytest.raises(HubError, match=r"falcon-7b is planned, not ready: .*FalconForCausalLM"):
        # an endpoint nothing listens on: the refusal must come before any request
        pull("falcon-7b", registry=registry, endpoint="http://127.0.0.1:9", cache_dir=tmp_path)
