"""Usage records: one model request's tokens, cost and duration (session seed
RecordUsage, RecordUsageFromProviderUsage), and how providers' usage shapes
map onto them (pure, no I/O).

turnkeeper counts tokens as pi does (``corpus/FORMATS.md`` §1, assistant
``usage``): ``input_tokens`` are the prompt tokens **not** read from a cache,
``cache_read_tokens`` and ``cache_write_tokens`` the prompt tokens read from
and written to the provider's cache, ``output_tokens`` everything generated
(reasoning included), and ``total_tokens`` the four together unless the
provider says otherwise. The shapes :func:`from_provider` reads:

========================  ==============================================================
shape (recognised by)     mapping
========================  ==============================================================
pi (``input``/``output``,  ``input``, ``output``, ``cacheRead``, ``cacheWrite``,
``cacheRead`` …)          ``totalTokens``; cost ``cost.total`` (US dollars)
OpenAI Chat Completions   input = ``prompt_tokens`` − ``prompt_tokens_details.cached_tokens``;
(``prompt_tokens``)       cache read = ``cached_tokens``; output = ``completion_tokens``;
                          total = ``total_tokens``
OpenAI Responses          input = ``input_tokens`` − ``input_tokens_details.cached_tokens``;
(``input_tokens`` with    cache read = ``cached_tokens``; output = ``output_tokens``;
``input_tokens_details``) total = ``total_tokens``
Anthropic Messages        input = ``input_tokens`` (which excludes the cache); cache read =
(``input_tokens``, no     ``cache_read_input_tokens``; cache write =
``…_details``)            ``cache_creation_input_tokens``; output = ``output_tokens``
Google Gemini             input = ``promptTokenCount`` + ``toolUsePromptTokenCount`` −
(``promptTokenCount`` or  ``cachedContentTokenCount``; cache read = ``cachedContentTokenCount``;
``prompt_token_count``)   output = ``candidatesTokenCount`` + ``thoughtsTokenCount``; total =
                          ``totalTokenCount`` (snake_case spellings too)
========================  ==============================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .errors import InvalidInputError

MAX_TOKENS = 10**12
"""The most tokens one figure of one request may count. Far above any model's
window; it keeps every sum a report makes within 64 bits."""

MAX_COST_USD = 10**9
"""The highest cost of one request, in US dollars (so sums stay finite)."""

SOURCES = ("record", "import")
"""Where a usage record came from: a runtime's ``store.usage.record…``, or the
usage an imported assistant message carries."""


@dataclass(frozen=True, slots=True)
class UsageFigures:
    """The figures of one request (``None``: unknown). Tokens are counts, cost
    is in US dollars (see the module docstring for what each counts)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    total_tokens: int | None = None
    cost_usd: float | None = None


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One model request's usage, kept per session (session seed RecordUsage).

    ``id`` is unique within the session: the caller's ``usage_id``, a new
    UUIDv7, or ``entry:<entry id>`` for the usage of an imported assistant
    message (``entry_id``). ``provider``/``protocol``/``model`` name the
    endpoint (pi's ``provider``, ``api`` and ``model``); token figures and
    ``cost_usd`` (US dollars) are as :class:`UsageFigures`; ``duration_ms``
    the request's duration in milliseconds; ``recorded_at`` when the request
    was made (an imported message's entry timestamp). ``None``: unknown.
    """

    session_id: str
    id: str
    provider: str
    protocol: str
    model: str
    input_tokens: int | None
    output_tokens: int | None
    cache_read_tokens: int | None
    cache_write_tokens: int | None
    total_tokens: int | None
    cost_usd: float | None
    duration_ms: int | None
    recorded_at: datetime
    run_id: str | None = None
    entry_id: str | None = None
    source: str = "record"

    @property
    def figures(self) -> UsageFigures:
        """The record's figures."""
        return UsageFigures(
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.cache_write_tokens,
            self.total_tokens,
            self.cost_usd,
        )


def _number(value: object) -> bool:
    # A tuple, not ``int | float``: CrossHair (crosshair-tool 0.0.113) judges a
    # symbolic int an instance of neither member of a union, which made every
    # contract below this hold vacuously.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def lenient_count(value: Any) -> int | None:
    """A token count read from a file: a non-negative whole number up to
    :data:`MAX_TOKENS` (an integral float counts), else ``None`` (unknown).

    pre: type(value) in (str, int, float, bool, list, dict, type(None))
    post: __return__ is None or 0 <= __return__ <= MAX_TOKENS
    post: __return__ is None or (__return__ == value and not isinstance(value, bool))
    """
    if not _number(value):
        return None
    assert isinstance(value, (int, float))
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    count = int(value)
    return count if 0 <= count <= MAX_TOKENS else None


def lenient_cost(value: Any) -> float | None:
    """A cost read from a file: a finite number from 0 to :data:`MAX_COST_USD`
    (US dollars), else ``None`` (unknown).

    pre: type(value) in (str, int, float, bool, list, dict, type(None))
    post: __return__ is None or (math.isfinite(__return__) and 0 <= __return__ <= MAX_COST_USD)
    post: __return__ is None or (__return__ == value and not isinstance(value, bool))
    """
    if not _number(value):
        return None
    assert isinstance(value, (int, float))
    cost = float(value)
    return cost if math.isfinite(cost) and 0 <= cost <= MAX_COST_USD else None


PI_KEYS = ("input", "output", "cacheRead", "cacheWrite", "totalTokens", "cost")


def from_pi_message(message: object) -> UsageFigures | None:
    """The figures a pi assistant message's ``usage`` carries, read leniently
    (a file is imported whatever its figures hold): each figure that is not a
    count (:func:`lenient_count`) or cost (:func:`lenient_cost`) is unknown.
    ``None`` when the message is not an assistant message or its ``usage`` is
    not an object holding any of pi's usage keys."""
    if not isinstance(message, Mapping) or message.get("role") != "assistant":
        return None
    usage = message.get("usage")
    if not isinstance(usage, Mapping) or not any(k in usage for k in PI_KEYS):
        return None
    cost = usage.get("cost")
    return UsageFigures(
        input_tokens=lenient_count(usage.get("input")),
        output_tokens=lenient_count(usage.get("output")),
        cache_read_tokens=lenient_count(usage.get("cacheRead")),
        cache_write_tokens=lenient_count(usage.get("cacheWrite")),
        total_tokens=lenient_count(usage.get("totalTokens")),
        cost_usd=lenient_cost(cost.get("total")) if isinstance(cost, Mapping) else None,
    )


ANTHROPIC_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


def from_anthropic_message(message: object) -> UsageFigures | None:
    """The figures an Anthropic Messages API response's ``usage`` carries (a
    Claude Code ``assistant`` row's ``message``), read leniently as
    :func:`from_pi_message`: ``input_tokens`` (the prompt's uncached part),
    ``output_tokens``, ``cache_read_input_tokens``,
    ``cache_creation_input_tokens`` (written to the cache), and their sum as
    the total (the API gives none; unknown when a part is). ``None`` when the
    message is not an assistant message or its ``usage`` holds neither
    ``input_tokens`` nor ``output_tokens``. No cost (the API gives none)."""
    if not isinstance(message, Mapping) or message.get("role") != "assistant":
        return None
    usage = message.get("usage")
    if not isinstance(usage, Mapping) or not any(k in usage for k in ANTHROPIC_KEYS[:2]):
        return None
    parts = [
        lenient_count(usage.get(k, 0) if k in ANTHROPIC_KEYS[2:] else usage.get(k))
        for k in ANTHROPIC_KEYS
    ]
    known = [p for p in parts if p is not None]
    total = sum(known) if len(known) == len(parts) and sum(known) <= MAX_TOKENS else None
    return UsageFigures(parts[0], parts[1], parts[2], parts[3], total, None)


def text_of(message: Mapping[str, Any], key: str) -> str:
    """A message's ``key`` when it is a string, else ``""``."""
    value = message.get(key)
    return value if isinstance(value, str) else ""


def check_count(value: Any, field: str) -> int:
    """A token count or duration given by a caller: an ``int`` from 0 to
    :data:`MAX_TOKENS`.

    Raises:
        InvalidInputError: anything else (a bool, a float, a negative number …).

    raises: InvalidInputError
    pre: type(value) in (str, int, float, bool, list, dict, type(None))
    post: 0 <= __return__ <= MAX_TOKENS
    post: __return__ == value and not isinstance(value, (bool, float))
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInputError(field, f"expected an int, got {type(value).__name__}")
    if not 0 <= value <= MAX_TOKENS:
        raise InvalidInputError(field, f"must be from 0 to {MAX_TOKENS}, got {value}")
    return int(value)


def check_cost(value: Any, field: str) -> float:
    """A cost in US dollars given by a caller: a finite number from 0 to
    :data:`MAX_COST_USD`.

    Raises:
        InvalidInputError: anything else.

    raises: InvalidInputError
    pre: type(value) in (str, int, float, bool, list, dict, type(None))
    post: math.isfinite(__return__) and 0 <= __return__ <= MAX_COST_USD
    post: __return__ == value and not isinstance(value, bool)
    """
    if not _number(value):
        raise InvalidInputError(field, f"expected a number, got {type(value).__name__}")
    assert isinstance(value, (int, float))
    cost = float(value)
    if not (math.isfinite(cost) and 0 <= cost <= MAX_COST_USD):
        raise InvalidInputError(field, f"must be a finite number from 0 to {MAX_COST_USD}")
    return cost


def _get(usage: Mapping[str, Any], *path: str) -> object:
    value: object = usage
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _count(usage: Mapping[str, Any], *path: str) -> int:
    """The count at ``path`` (0 when absent or ``null``)."""
    value = _get(usage, *path)
    return 0 if value is None else check_count(value, "usage." + ".".join(path))


def _total(usage: Mapping[str, Any], key: str, parts: int) -> int:
    given = usage.get(key)
    return parts if given is None else check_count(given, f"usage.{key}")


def _less_cached(prompt: int, cached: int, field: str) -> int:
    if cached > prompt:
        raise InvalidInputError(field, f"{cached} cached tokens of a {prompt}-token prompt")
    return prompt - cached


def _gemini(usage: Mapping[str, Any], snake: bool) -> UsageFigures:
    def name(camel: str) -> str:
        if not snake:
            return camel
        return "".join("_" + c.lower() if c.isupper() else c for c in camel)

    cached = _count(usage, name("cachedContentTokenCount"))
    prompt = _count(usage, name("promptTokenCount")) + _count(
        usage, name("toolUsePromptTokenCount")
    )
    output = _count(usage, name("candidatesTokenCount")) + _count(usage, name("thoughtsTokenCount"))
    new = _less_cached(prompt, cached, f"usage.{name('cachedContentTokenCount')}")
    return UsageFigures(
        new, output, cached, 0, _total(usage, name("totalTokenCount"), prompt + output)
    )


def from_provider(usage: Mapping[str, Any]) -> UsageFigures:
    """The figures of a provider's usage object, strictly (session seed
    RecordUsageFromProviderUsage): the shape is recognised by its keys (see
    the module docstring); an absent or ``null`` count is 0; ``total_tokens``
    is the provider's total when it gives one, else the sum of the parts.
    Only pi's shape carries a cost (``cost.total``).

    Raises:
        InvalidInputError: not a mapping, no known shape (or two at once), a
            count that is not an int from 0 to :data:`MAX_TOKENS`, more cached
            tokens than prompt tokens, or a cost that is not a finite number.
    """
    if not isinstance(usage, Mapping):
        raise InvalidInputError("usage", "expected a mapping (a provider's usage object)")
    shapes = [
        name
        for name, keys in (
            ("pi", ("input", "output", "cacheRead", "cacheWrite", "totalTokens")),
            ("chat", ("prompt_tokens", "completion_tokens")),
            ("messages", ("input_tokens", "output_tokens")),
            ("gemini", ("promptTokenCount", "candidatesTokenCount", "totalTokenCount")),
            ("gemini_snake", ("prompt_token_count", "candidates_token_count", "total_token_count")),
        )
        if any(k in usage for k in keys)
    ]
    if len(shapes) != 1:
        found = " and ".join(shapes) if shapes else "none"
        raise InvalidInputError(
            "usage", f"expected exactly one known provider usage shape, found {found}"
        )
    shape = shapes[0]
    if shape == "pi":
        parts = [_count(usage, k) for k in ("input", "cacheRead", "cacheWrite", "output")]
        cost = _get(usage, "cost", "total")
        return UsageFigures(
            parts[0],
            parts[3],
            parts[1],
            parts[2],
            _total(usage, "totalTokens", sum(parts)),
            None if cost is None else check_cost(cost, "usage.cost.total"),
        )
    if shape == "chat":
        prompt = _count(usage, "prompt_tokens")
        cached = _count(usage, "prompt_tokens_details", "cached_tokens")
        output = _count(usage, "completion_tokens")
        new = _less_cached(prompt, cached, "usage.prompt_tokens_details.cached_tokens")
        return UsageFigures(new, output, cached, 0, _total(usage, "total_tokens", prompt + output))
    if shape == "messages":
        openai = "input_tokens_details" in usage or "output_tokens_details" in usage
        anthropic = "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage
        if openai and anthropic:
            raise InvalidInputError(
                "usage", "both OpenAI Responses details and Anthropic cache counts"
            )
        output = _count(usage, "output_tokens")
        if openai:
            prompt = _count(usage, "input_tokens")
            cached = _count(usage, "input_tokens_details", "cached_tokens")
            new = _less_cached(prompt, cached, "usage.input_tokens_details.cached_tokens")
            total = _total(usage, "total_tokens", prompt + output)
            return UsageFigures(new, output, cached, 0, total)
        new = _count(usage, "input_tokens")
        read = _count(usage, "cache_read_input_tokens")
        write = _count(usage, "cache_creation_input_tokens")
        total = _total(usage, "total_tokens", new + read + write + output)
        return UsageFigures(new, output, read, write, total)
    return _gemini(usage, shape == "gemini_snake")
