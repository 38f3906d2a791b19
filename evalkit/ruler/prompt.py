"""How a sample becomes the text the engine feeds: `before + input + between + prefix`.

Base models get `input + prefix`; chat models the input inside the user turn and the answer
prefix at the start of the assistant turn (as NVIDIA's model templates do).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import UserError
from evalkit.models.check import one_line

_SENTINEL = "\u2063EVALKIT_RULER_INPUT\u2063"


@dataclass(frozen=True)
class PromptFormat:
    name: str = "base"
    before: str = ""
    between: str = ""
    add_special_tokens: bool = True  # False when the wrapping text already holds the BOS

    def render(self, input_text: str, answer_prefix: str) -> str:
        return self.before + input_text + self.between + answer_prefix

    def cache_token(self) -> str:
        digest = hashlib.sha256(f"{self.before}\x00{self.between}\x00{self.add_special_tokens}".encode())
        return f"{self.name}-{digest.hexdigest()[:12]}"

    @classmethod
    def from_chat_template(cls, tokenizer) -> PromptFormat:
        """The tokenizer's chat template around one user turn, generation prompt open."""
        if not getattr(tokenizer, "chat_template", None):
            raise UserError("this tokenizer has no chat template: use the base prompt format")
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": _SENTINEL}], tokenize=False, add_generation_prompt=True
            )
        except Exception as err:  # jinja's TemplateError, SecurityError (sandbox), or the template's own raise
            raise UserError(
                f"the chat template in {chat_template_file(tokenizer)} cannot be rendered "
                f"({type(err).__name__}: {one_line(err)}); fix it or use --prompt-format base"
            ) from None
        if not isinstance(text, str) or text.count(_SENTINEL) != 1:
            raise UserError(
                f"the chat template in {chat_template_file(tokenizer)} does not place the user message exactly once"
            )
        before, between = text.split(_SENTINEL)
        bos = getattr(tokenizer, "bos_token", None)
        # A template that writes the BOS itself must not get a second one from the tokenizer.
        add_special = not (bos and before.startswith(bos))
        return cls("chat", before, between, add_special)


BASE = PromptFormat()


def chat_template_file(tokenizer) -> Path | str:
    """Where transformers reads a tokenizer's chat template from: chat_template.jinja, else
    chat_template.json, else tokenizer_config.json."""
    folder = Path(getattr(tokenizer, "name_or_path", "") or ".")
    if not folder.is_dir():
        return f"the tokenizer {tokenizer.name_or_path!r}"
    for name in ("chat_template.jinja", "chat_template.json"):
        if (folder / name).is_file():
            return folder / name
    return folder / "tokenizer_config.json"
