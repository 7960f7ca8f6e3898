"""A checkpoint's own code never runs: every call into transformers passes
`trust_remote_code=False`, and a folder whose JSON files map classes to its own Python
(`auto_map`) is refused by Linnet, naming the file, before transformers reads it. The hostile
code would write a canary file; a `y` waits on standard input in case anything asks."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from linnet.cli import main
from linnet.errors import CheckpointError, RemoteCode
from linnet.remote_code import refuse_remote_code

ROOT = Path(__file__).resolve().parents[2]
CODE = ("linnet", "converters", "zoo", "scripts", "bench", "tests")

EVIL = """from pathlib import Path
Path({canary!r}).write_text("ran")
from transformers import LlamaConfig as EvilConfig
from transformers import PreTrainedTokenizerFast as EvilTokenizer
"""


def from_pretrained_calls(path: Path):
    """(line, keywords) of every `X.from_pretrained(...)` call in a file."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "from_pretrained":
                yield node.lineno, {k.arg: k.value for k in node.keywords}


def test_every_call_into_transformers_passes_trust_remote_code_false():
    missing = []
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, kw in from_pretrained_calls(path):
                value = kw.get("trust_remote_code")
                if not (isinstance(value, ast.Constant) and value.value is False):
                    missing.append(f"{path.relative_to(ROOT)}:{line}")
    assert missing == []


@pytest.fixture
def hostile(tiny_checkpoint, tmp_path):
    """A tiny Llama checkpoint whose config.json and tokenizer_config.json map classes to
    modules in the folder that write a canary when imported."""
    folder = tmp_path / "hostile"
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), folder)
    canary = tmp_path / "canary"
    for module in ("configuration_evil", "tokenization_evil"):
        (folder / f"{module}.py").write_text(EVIL.format(canary=str(canary)))
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig"}
    (folder / "config.json").write_text(json.dumps(config))
    auto_tokenizer = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    tok = {"tokenizer_class": "EvilTokenizer", "auto_map": auto_tokenizer}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    return folder, canary


@pytest.mark.parametrize("command", ["run", "parity"])
def test_cli_refuses_a_folder_with_its_own_code(hostile, command):
    folder, canary = hostile
    done = CliRunner().invoke(main, [command, str(folder), "--prompt", "hi"], input="y\ny\n")
    assert done.exit_code == 1, done.output
    assert "config.json" in done.output and "auto_map" in done.output
    assert "Traceback" not in done.output and not isinstance(done.exception, RemoteCode)
    assert not canary.exists()


def test_the_tokenizer_config_alone_is_refused(hostile):
    folder, canary = hostile
    config = json.loads((folder / "config.json").read_text())
    del config["auto_map"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(RemoteCode, match="tokenizer_config.json"):
        refuse_remote_code(folder)
    assert not canary.exists()


def test_transformers_itself_refuses_without_asking(hostile):
    """The second line of defence, in case a folder gets past the first: with
    trust_remote_code=False transformers raises instead of importing or prompting."""
    from transformers import AutoConfig

    folder, canary = hostile
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "evil"  # a type only the folder's code defines
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError):
        AutoConfig.from_pretrained(folder, trust_remote_code=False)
    assert not canary.exists()


def test_a_companion_that_is_not_json_is_named(tiny_checkpoint, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint("LlamaForCausalLM"), folder)
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="tokenizer_config.json: not a readable JSON"):
        refuse_remote_code(folder)
    done = CliRunner().invoke(main, ["run", str(folder), "--prompt", "hi"])
    assert done.exit_code == 1 and "tokenizer_config.json" in done.output, done.output
    assert "Traceback" not in done.output
