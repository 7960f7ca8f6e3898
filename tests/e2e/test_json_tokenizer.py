"""The tokenizer `linnet run` and `linnet chat` use without importing transformers
(linnet/parity/json_tokenizer.py) gives AutoTokenizer's ids and text, and steps aside for
every folder transformers' loading would change."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import jinja2
import pytest

from linnet.parity import load_tokenizer
from linnet.parity.json_tokenizer import JsonTokenizer, open_json_tokenizer
from tests.tiny_tokenizer import add_tiny_tokenizer

HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "w1 w2 héllo, 2 + 2? 東京 🙂 <|im_start|> w3"},
    {"role": "assistant", "content": "w3 four\n\n  spaced"},
    {"role": "user", "content": "w4 and then?"},
]
PLAIN = ["w5 plain  text ü", "", "  leading and trailing  ", "<|im_end|>w6\nnew line"]
# a template that uses what transformers' environment adds: tojson without HTML escapes,
# namespace, dict(), loop controls, the special tokens' text; indented block tags on their
# own lines (trimmed and left-stripped)
RICH_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}\n"
    "  {% if m['role'] == 'system' %}{% continue %}{% endif %}\n  {% set ns.n = ns.n + 1 %}"
    "<|im_start|>{{ m['role'] }} {{ ns.n }}\n{{ m['content'] | tojson }}"
    "{{ dict(a=1) | tojson }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{{ eos_token }}"
)


def _agree(folder):
    """The light tokenizer is taken for the folder and gives AutoTokenizer's EOS, template,
    chat ids (with and without the generation prompt), plain ids and decoded text."""
    from transformers import AutoTokenizer

    light = load_tokenizer(folder, light=True)
    auto = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    assert isinstance(light, JsonTokenizer)
    assert light.chat_template == auto.chat_template and light.eos_token_id == auto.eos_token_id
    for prompt in (True, False):
        kw = dict(add_generation_prompt=prompt, tokenize=True, return_dict=True)
        want = auto.apply_chat_template(HISTORY, **kw)["input_ids"]
        assert light.apply_chat_template(HISTORY, **kw)["input_ids"] == want
        kw["tokenize"] = False
        assert light.apply_chat_template(HISTORY, **kw) == auto.apply_chat_template(HISTORY, **kw)
    for text in PLAIN:
        assert light(text)["input_ids"] == auto(text)["input_ids"], text
    chunks = [list(range(i, min(i + 97, len(auto)))) for i in range(0, len(auto), 97)]
    for ids in chunks[:40] + chunks[-3:]:  # the added (special) tokens sit at the end
        for skip in (True, False):
            assert light.decode(ids, skip) == auto.decode(ids, skip_special_tokens=skip)
    return light, auto


def test_smollm2_tokenizer_agrees(smollm2_checkpoint):
    _agree(smollm2_checkpoint)


def test_a_word_level_tokenizer_agrees(tmp_path):
    _agree(add_tiny_tokenizer(tmp_path / "tiny", chat=True))


def test_bos_post_processor_added_tokens_and_a_rich_template_agree(smollm2_checkpoint, tmp_path):
    """A tokenizer.json whose post-processor writes BOS, an extra special token and a
    template that uses transformers' jinja2 globals: all taken as they are."""
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(smollm2_checkpoint, trust_remote_code=False)
    auto.add_bos_token = True  # rewrites the post-processor
    auto.add_special_tokens({"additional_special_tokens": ["<tool>"]})
    auto.chat_template = RICH_TEMPLATE
    auto.save_pretrained(tmp_path)
    light, reloaded = _agree(tmp_path)
    assert light("w1")["input_ids"][0] == reloaded.bos_token_id  # BOS written on plain text
    assert light("a <tool> b")["input_ids"] == reloaded("a <tool> b")["input_ids"]


def _edited(folder, tmp_path, config=None, files=None):
    """A copy of a tokenizer folder with tokenizer_config.json's keys set (None deletes)."""
    out = tmp_path / "edited"
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (folder / name).is_file():
            (out / name).write_bytes((folder / name).read_bytes())
    data = json.loads((out / "tokenizer_config.json").read_text())
    for key, value in (config or {}).items():
        data.pop(key, None) if value is None else data.__setitem__(key, value)
    (out / "tokenizer_config.json").write_text(json.dumps(data))
    for name, text in (files or {}).items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(text)
    return out


@pytest.mark.parametrize(
    "edit",
    [
        {"config": {"tokenizer_class": "GPT2Tokenizer"}},
        {"config": {"bos_token": "<|not-in-the-vocab|>"}},
        {"config": {"extra_special_tokens": ["<|also-new|>"]}},
        {"config": {"clean_up_tokenization_spaces": True}},
        {"config": {"split_special_tokens": True}},
        {"files": {"chat_template.jinja": "{% generation %}{{ messages }}{% endgeneration %}"}},
        {"files": {"additional_chat_templates/tool_use.jinja": "{{ messages }}"}},
    ],
    ids=["class", "bos", "extra", "cleanup", "split", "generation", "two-templates"],
)
def test_folders_transformers_would_change_get_transformers(smollm2_checkpoint, tmp_path, edit):
    """Anything transformers' loading adds or changes sends the folder to transformers."""
    folder = _edited(smollm2_checkpoint, tmp_path, **edit)
    assert open_json_tokenizer(folder) is None
    assert not isinstance(load_tokenizer(folder, light=True), JsonTokenizer)


def test_the_plain_folder_is_taken(smollm2_checkpoint, tmp_path):
    """The control of the test above: the same copy, unedited, is taken."""
    assert isinstance(open_json_tokenizer(_edited(smollm2_checkpoint, tmp_path)), JsonTokenizer)


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{% set ns = namespace() %}{% set ns._x = 1 %}",
        "{{ messages.append(1) }}",
    ],
    ids=["dunder", "namespace", "mutation"],
)
def test_the_template_runs_sandboxed(smollm2_checkpoint, tmp_path, template):
    """A checkpoint's template is untrusted code: no dunders, no private namespace names,
    no mutation of what it is given."""
    tok = open_json_tokenizer(_edited(smollm2_checkpoint, tmp_path, files={
        "chat_template.jinja": template}))  # fmt: skip
    with pytest.raises(jinja2.exceptions.SecurityError):
        tok.apply_chat_template(HISTORY, tokenize=False)


def test_linnet_run_does_not_import_transformers(smollm2_checkpoint):
    """The point of the class: a fresh `linnet run` never imports transformers."""
    code = (
        "import sys\nfrom linnet.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as done:\n    assert not done.code\n"
        "print('transformers' in sys.modules)"
    )
    args = ["run", str(smollm2_checkpoint), "--prompt", "Hi.", "--max-new-tokens", "2"]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"


def test_a_failing_template_is_one_error_line(smollm2_checkpoint, tmp_path):
    """A template's own raise_exception ends `linnet run` with its message, exit 1."""
    from click.testing import CliRunner

    from linnet.cli import main

    folder = tmp_path / "copy"
    folder.mkdir()
    for item in smollm2_checkpoint.iterdir():
        try:
            (folder / item.name).hardlink_to(item)
        except OSError:  # another file system
            shutil.copyfile(item, folder / item.name)
    (folder / "chat_template.jinja").unlink()
    (folder / "chat_template.jinja").write_text("{{ raise_exception('no system turns') }}")
    done = CliRunner().invoke(main, ["run", str(folder), "--prompt", "hi"])
    assert done.exit_code == 1, done.output
    assert done.output.strip() == "error: the checkpoint's chat template failed: no system turns"
