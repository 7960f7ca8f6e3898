"""A checkpoint's tokenizer.json and chat template, without importing transformers.

    tokenizer = open_json_tokenizer(folder)   # None: the folder needs transformers' loading
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]

`linnet run` and `linnet chat` need only three things of a tokenizer: encode, decode and
the chat template. transformers' fast tokenizer does each by calling the `tokenizers`
library and rendering the template in a sandboxed jinja2 environment; importing it costs
~0.4 s of a fresh process (docs/zoo.md). This class does the same calls itself, and only
for folders whose files transformers would take as they are: `_why_transformers` names
anything else (a GGUF, another class, tokens the config adds, a template dictionary, ...)
and the caller then loads transformers' tokenizer instead. tests/e2e/test_json_tokenizer.py
checks the ids and text against AutoTokenizer.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

# the config's named special tokens; transformers passes their text to the template
_NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
          "mask_token")  # fmt: skip
_PLAIN_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
_BIG_VOCAB = 100_000  # transformers may patch the pre-tokenizer's regex past this size


class JsonTokenizer:
    """Encode, decode and chat template as transformers' fast tokenizer gives them for a
    plain tokenizer.json folder (the subset `linnet run` and `linnet chat` call)."""

    def __init__(self, backend, config: dict, chat_template: str | None):
        self.backend = backend
        self.chat_template = chat_template
        self.special = {k: _text(config[k]) for k in _NAMED if config.get(k) is not None}
        eos = self.special.get("eos_token")
        self.eos_token_id = backend.token_to_id(eos) if eos is not None else None
        self._template = None

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages, add_generation_prompt=False, tokenize=True, return_dict=True
    ):
        """The rendered conversation (user strings as they are), tokenized without the
        post-processor's special tokens: the template writes its own."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        if self._template is None:
            self._template = _sandboxed(self.chat_template)
        chat = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
        text = self._template.render(
            messages=chat, tools=None, documents=None,
            add_generation_prompt=add_generation_prompt, **self.special,
        )  # fmt: skip
        if not tokenize:
            return text
        out = self(text, add_special_tokens=False)
        return out if return_dict else out["input_ids"]


def open_json_tokenizer(folder: Path) -> JsonTokenizer | None:
    """The folder's tokenizer as JsonTokenizer, or None where only transformers' own loading
    gives the same tokenizer (or `tokenizers` is not installed)."""
    folder = Path(folder)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = _template_of(folder, config)
        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        if _why_transformers(folder, config, backend, template):
            return None
    except Exception:  # noqa: BLE001 - transformers' loader then names what is wrong
        return None
    return JsonTokenizer(backend, config, template)


def _why_transformers(folder: Path, config: dict, backend, template) -> str | None:
    """What of these files transformers' loading would change or add (None: nothing)."""
    import jinja2

    if config.get("tokenizer_class") not in _PLAIN_CLASSES:
        return f"tokenizer_class {config.get('tokenizer_class')!r}"
    if tuple(int(p) for p in re.findall(r"\d+", jinja2.__version__)[:3]) < (3, 1, 6):
        return "jinja2 older than 3.1.6 (transformers refuses its sandbox)"
    if backend.truncation is not None or backend.padding is not None:
        return "truncation or padding in tokenizer.json"
    if config.get("split_special_tokens") or config.get("clean_up_tokenization_spaces"):
        return "split_special_tokens or clean_up_tokenization_spaces"
    if backend.get_vocab_size(with_added_tokens=True) > _BIG_VOCAB:
        return "a vocabulary transformers may patch"
    if (folder / "additional_chat_templates").exists() or (folder / "chat_template.json").exists():
        return "more than one chat template"
    if template is not None and not isinstance(template, str):
        return "a dictionary of chat templates"
    if re.search(r"\{%-?\s*generation\s*-?%\}", template or ""):
        return "a {% generation %} block (transformers' own jinja2 extension)"
    return _missing_tokens(config, backend.get_added_tokens_decoder())


def _missing_tokens(config: dict, added: dict) -> str | None:
    """A special or added token the config names that tokenizer.json's added tokens
    (`added`: id -> AddedToken) lack (transformers would add it), or hold with other flags."""
    held = {token.content: (index, token) for index, token in added.items()}
    for key in _NAMED:
        if config.get(key) is not None and _text(config[key]) not in held:
            return f"{key} not among tokenizer.json's added tokens"
    for key in ("extra_special_tokens", "additional_special_tokens"):
        extra = config.get(key) or ()
        for token in extra.values() if isinstance(extra, dict) else extra:
            if _text(token) not in held:
                return f"{key} not among tokenizer.json's added tokens"
    named = config.get("added_tokens_decoder") or {}
    if not isinstance(named, dict):
        return "added_tokens_decoder is not a mapping"
    for index, token in named.items():
        index_ours, ours = held.get(_text(token), (None, None))
        if ours is None or str(index_ours) != str(index):
            return f"added token {index} not in tokenizer.json"
        flags = token.items() if isinstance(token, dict) else ()
        if any(hasattr(ours, k) and getattr(ours, k) != v for k, v in flags if k != "content"):
            return f"added token {index} has other flags in tokenizer.json"
    return None


def _template_of(folder: Path, config: dict):
    """chat_template.jinja before the config's entry, as transformers takes them."""
    raw = folder / "chat_template.jinja"
    if raw.is_file():
        return raw.read_text(encoding="utf-8")
    return config.get("chat_template")


def _text(token) -> str:
    """A token as tokenizer_config.json writes it: its text, or an AddedToken's fields."""
    return token.get("content", "") if isinstance(token, dict) else str(token)


def _sandboxed(source: str):
    """The template compiled as transformers compiles chat templates: an immutable sandbox,
    trimmed blocks, loop controls, JSON without HTML escapes, raise_exception, strftime_now,
    and namespaces that refuse underscored names."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, attrs = args[0], dict(*args[1:], **kwargs)
            for name in attrs:
                _refuse_private(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _refuse_private(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals.update(
        raise_exception=raise_exception,
        strftime_now=lambda fmt: datetime.now().strftime(fmt),
        dict=_TemplateDict(),
        namespace=Namespace,
    )
    return env.from_string(source)


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, not the type itself."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def _refuse_private(name) -> None:
    import jinja2

    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a chat template may not set {name!r}")
