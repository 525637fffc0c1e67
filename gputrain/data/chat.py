"""A conversation (`messages`: role/content, the OpenAI and Hugging Face chat format) rendered with a
tokenizer's chat template, cut into the text the model reads (no loss) and the assistant's turns
(the loss).

The template is tokenizer_config.json's `chat_template` (Jinja), rendered with jinja2 directly, as
transformers renders it (a sandboxed environment, trim_blocks and lstrip_blocks, `raise_exception`,
a `tojson` that keeps non-ASCII text): transformers is not needed. The template's variables are
`messages`, `add_generation_prompt`, `eos_token` (the tokenizer's end-of-document token) and
`bos_token` ("": the template's text is tokenized without special tokens, and the examples are
separated by the EOS).

An assistant turn k is the text the template adds to messages[:k] rendered with the generation
prompt when messages[:k + 1] is rendered: the generation prompt itself ("<|im_start|>assistant\n")
is read, not learnt; the assistant's content and the template's end of turn after it are learnt.
Messages after the last assistant turn have nothing to learn and are left out. A template whose
rendering of a conversation does not begin with its rendering of the conversation so far (one that
rewrites earlier turns) cannot be cut so, and is refused.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from typing import Any

from gputrain.errors import DataError

ROLES = ("system", "user", "assistant", "tool")
"""The roles a message may have."""


def _raise(message: str) -> None:
    raise ValueError(message)


def _tojson(value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


@cache
def _compiled(template: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def check_messages(where: str, messages: Any) -> list[dict[str, str]]:
    """`messages` as a list of {role, content} with known roles and text content.

    Raises:
        DataError: `where` (file: line) and what is wrong.
    """
    if not isinstance(messages, list) or not messages:
        raise DataError(f'{where}: \'messages\' must be a non-empty list of {{"role": ..., "content": ...}}')
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise DataError(f"{where}: messages[{i}] is not an object with a 'role'")
        if message["role"] not in ROLES:
            raise DataError(f"{where}: messages[{i}] has role {message['role']!r}; roles: {', '.join(ROLES)}")
        if not isinstance(message.get("content"), str):
            raise DataError(f"{where}: messages[{i}] ({message['role']}) has no text 'content' (a string)")
        checked.append({"role": message["role"], "content": message["content"]})
    if not any(m["role"] == "assistant" for m in checked):
        raise DataError(f"{where}: no assistant message: nothing to learn (the loss is on the assistant's turns)")
    return checked


def render_turns(where: str, template: str, messages: list[dict[str, str]], eos_token: str) -> list[tuple[str, bool]]:
    """The conversation as consecutive (text, is_assistant_turn) pieces (module docstring).

    Raises:
        DataError: `where` and why: the template fails, or rewrites the turns before the last.
    """
    compiled = _compiled(template)

    def render(upto: int, generation_prompt: bool) -> str:
        try:
            return str(
                compiled.render(
                    messages=messages[:upto],
                    add_generation_prompt=generation_prompt,
                    eos_token=eos_token,
                    bos_token="",
                )
            )
        except Exception as err:  # noqa: BLE001 — the template's own errors (raise_exception, undefined names)
            raise DataError(f"{where}: the tokenizer's chat template fails on this conversation: {err}") from None

    pieces: list[tuple[str, bool]] = []
    done = ""
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt, full = render(k, True), render(k + 1, False)
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise DataError(
                f"{where}: the chat template renders the conversation up to assistant turn {k} differently from "
                "the whole of it, so its turns cannot be told apart; give prompt/response fields instead"
            )
        pieces += [(prompt[len(done) :], False), (full[len(prompt) :], True)]
        done = full
    return [(text, learnt) for text, learnt in pieces if text]
