"""One sample of every Responses input item type the OpenAI Agents SDK accepts
(``agents.items.TResponseInputItem``, the ``openai`` package's
``ResponseInputItemParam`` union), built from the TypedDicts themselves: every key,
required and optional, in declaration order, so a round trip is checked on each key
and its order."""

from __future__ import annotations

import collections.abc
import types
import typing
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin, get_type_hints

from agents.items import TResponseInputItem
from typing_extensions import is_typeddict

_TEXT = 'sample ü 字 \U0001f600 \x00 "quoted" \\ end'


def _unwrap(tp: Any) -> Any:
    while get_origin(tp) in (Required, NotRequired, typing.Required, typing.NotRequired):
        tp = get_args(tp)[0]
    return tp


def sample(tp: Any, depth: int = 0) -> Any:
    """A JSON value of type ``tp`` (a TypedDict, union, literal, list …)."""
    tp = _unwrap(tp)
    origin = get_origin(tp)
    if depth > 8:
        return None
    if tp is str:
        return _TEXT
    if tp is bool:
        return True
    if tp is int:
        return 7
    if tp is float:
        return 1.25
    if tp is type(None):
        return None
    if tp is object or tp is Any:
        return {"any": [1, "two", None]}
    if origin is Literal:
        return get_args(tp)[0]
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        return sample(options[0], depth + 1) if options else None
    if is_typeddict(tp):
        hints = get_type_hints(tp, include_extras=True)
        return {key: sample(hint, depth + 1) for key, hint in hints.items()}
    if origin in (
        list,
        collections.abc.Iterable,
        collections.abc.Sequence,
        typing.Iterable,
        typing.Sequence,
    ):
        return [sample(get_args(tp)[0], depth + 1)]
    if origin in (dict, collections.abc.Mapping, typing.Mapping):
        return {"key": sample(get_args(tp)[1], depth + 1)}
    if isinstance(tp, typing.TypeAliasType if hasattr(typing, "TypeAliasType") else ()):
        return sample(tp.__value__, depth + 1)
    raise TypeError(f"no sample for {tp!r}")


def item_types() -> list[Any]:
    """Every member TypedDict of the SDK's input item union."""
    return [t for t in get_args(_unwrap(TResponseInputItem)) if is_typeddict(t)]


def every_item() -> list[TResponseInputItem]:
    """One full sample of each member of the union, plus the shapes the SDK writes
    most: a user message with text, image and file parts, an assistant output
    message, a function call and its output, and reasoning with encrypted content."""
    samples = [sample(t) for t in item_types()]
    samples += [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "what is in this picture?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
                {"type": "input_file", "file_data": "JVBERi0=", "filename": "a.pdf"},
            ],
        },
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "a cat", "annotations": []}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "lookup",
            "arguments": '{"q": "cat", "n": 1.5e3}',
            "id": "fc_1",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": '{"ok": true}'},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "thinking"}],
            "encrypted_content": "gAAAAABo" + "x" * 300,
        },
    ]
    return typing.cast(list[TResponseInputItem], samples)
