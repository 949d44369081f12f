"""The crypto core (storage/crypto/): key providers and sealed values.

Each refusal is shown against the value it refuses: a sealed value opens
only for the session, record, field and key version it was sealed for, and
a wrapped data key unwraps only under its master key and context.
"""

from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper.spec.errors import (
    InvalidInputError,
    KeyUnwrapError,
    PayloadAuthenticationError,
)
from turnkeeper.storage.crypto import DataKey, KeyProvider, LocalKeyProvider
from turnkeeper.storage.crypto.seal import (
    OVERHEAD,
    TEXT_PREFIX,
    is_sealed_text,
    key_version,
    wrap_context,
)


def _provider(*ids: str) -> LocalKeyProvider:
    return LocalKeyProvider.from_text("\n".join(LocalKeyProvider.generate(i) for i in ids))


def test_generated_key_round_trips_its_text_form() -> None:
    line = LocalKeyProvider.generate()
    provider = LocalKeyProvider.from_text(line)
    assert isinstance(provider, KeyProvider)
    assert line.startswith(provider.key_id + ":")
    assert len(base64.b64decode(line.split(":", 1)[1])) == 32


def test_first_key_is_current_and_others_still_unwrap() -> None:
    old_line = LocalKeyProvider.generate("old")
    wrapped = LocalKeyProvider.from_text(old_line).wrap(b"k" * 32, wrap_context("s1", 1))
    both = LocalKeyProvider.from_text(LocalKeyProvider.generate("new") + "," + old_line)
    assert both.key_id == "new"
    assert both.key_ids == ("new", "old")
    assert both.unwrap(wrapped, "old", wrap_context("s1", 1)) == b"k" * 32
    rewrapped = both.wrap(b"k" * 32, wrap_context("s1", 1))
    assert both.unwrap(rewrapped, "new", wrap_context("s1", 1)) == b"k" * 32


def test_unwrap_refuses_an_unknown_key_id() -> None:
    provider = _provider("a")
    wrapped = provider.wrap(b"k" * 32, wrap_context("s1", 1))
    with pytest.raises(KeyUnwrapError) as caught:
        provider.unwrap(wrapped, "b", wrap_context("s1", 1))
    assert caught.value.key_id == "b"


def test_unwrap_refuses_another_key_under_the_same_id() -> None:
    wrapped = _provider("a").wrap(b"k" * 32, wrap_context("s1", 1))
    with pytest.raises(KeyUnwrapError):
        _provider("a").unwrap(wrapped, "a", wrap_context("s1", 1))


@pytest.mark.parametrize("context", [wrap_context("s2", 1), wrap_context("s1", 2)])
def test_unwrap_refuses_another_sessions_or_versions_wrapped_key(context: bytes) -> None:
    provider = _provider("a")
    wrapped = provider.wrap(b"k" * 32, wrap_context("s1", 1))
    assert provider.unwrap(wrapped, "a", wrap_context("s1", 1)) == b"k" * 32  # control
    with pytest.raises(KeyUnwrapError):
        provider.unwrap(wrapped, "a", context)


def test_unwrap_refuses_a_flipped_byte() -> None:
    provider = _provider("a")
    wrapped = bytearray(provider.wrap(b"k" * 32, wrap_context("s1", 1)))
    for i in range(len(wrapped)):
        flipped = bytearray(wrapped)
        flipped[i] ^= 1
        with pytest.raises(KeyUnwrapError):
            provider.unwrap(bytes(flipped), "a", wrap_context("s1", 1))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# only a comment",
        "no-separator",
        "a:not base64!",
        "a:" + base64.b64encode(b"short").decode(),
        "a:b:" + base64.b64encode(b"k" * 32).decode(),
        "a:{k}\na:{k}".format(k=base64.b64encode(b"k" * 32).decode()),
        "bad id\x00:" + base64.b64encode(b"k" * 32).decode(),
    ],
)
def test_key_text_that_is_not_the_form_is_refused(text: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        LocalKeyProvider.from_text(text)
    assert caught.value.field == "encryption"


def test_env_and_file_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = LocalKeyProvider.generate("from-env")
    monkeypatch.setenv("TURNKEEPER_MASTER_KEY", line)
    assert LocalKeyProvider.from_env().key_id == "from-env"
    monkeypatch.delenv("TURNKEEPER_MASTER_KEY")
    with pytest.raises(InvalidInputError):
        LocalKeyProvider.from_env()
    path = tmp_path / "keys"
    path.write_text("# turnkeeper keys\n" + line + "\n")
    assert LocalKeyProvider.from_file(path).key_id == "from-env"
    with pytest.raises(InvalidInputError):
        LocalKeyProvider.from_file(tmp_path / "missing")


def test_sealed_value_round_trips_and_names_its_version() -> None:
    key = DataKey.new("s1", version=3)
    sealed = key.seal("e1", "payload", b"hello")
    assert len(sealed) == len(b"hello") + OVERHEAD
    assert key_version(sealed) == 3
    assert key.open("e1", "payload", sealed) == b"hello"
    text = key.seal_text("e1", "payload", '{"a":"\\u0000ü"}')
    assert is_sealed_text(text)
    assert key.open_text("e1", "payload", text) == '{"a":"\\u0000ü"}'


@pytest.mark.parametrize(
    ("session_id", "record_id", "field_name"),
    [("s2", "e1", "payload"), ("s1", "e2", "payload"), ("s1", "e1", "result")],
)
def test_a_value_moved_elsewhere_fails_authentication(
    session_id: str, record_id: str, field_name: str
) -> None:
    key = DataKey.new("s1")
    sealed = key.seal("e1", "payload", b"secret")
    elsewhere = DataKey(session_id, 1, key.key)
    with pytest.raises(PayloadAuthenticationError) as caught:
        elsewhere.open(record_id, field_name, sealed)
    assert (caught.value.session_id, caught.value.record_id, caught.value.field) == (
        session_id,
        record_id,
        field_name,
    )


def test_every_flipped_byte_and_truncation_fails_authentication() -> None:
    key = DataKey.new("s1")
    sealed = key.seal("e1", "payload", b"secret payload")
    for i in range(len(sealed)):
        flipped = bytearray(sealed)
        flipped[i] ^= 0x80
        with pytest.raises(PayloadAuthenticationError):
            key.open("e1", "payload", bytes(flipped))
    for n in range(len(sealed)):
        with pytest.raises(PayloadAuthenticationError):
            key.open("e1", "payload", sealed[:n])


def test_another_key_or_version_fails_authentication() -> None:
    key = DataKey.new("s1", 1)
    sealed = key.seal("e1", "payload", b"secret")
    with pytest.raises(PayloadAuthenticationError):
        DataKey.new("s1", 1).open("e1", "payload", sealed)
    with pytest.raises(PayloadAuthenticationError):
        DataKey("s1", 2, key.key).open("e1", "payload", sealed)


@pytest.mark.parametrize("text", ['{"a":1}', TEXT_PREFIX + "!!!", TEXT_PREFIX])
def test_text_that_is_not_a_sealed_value_is_refused(text: str) -> None:
    with pytest.raises(PayloadAuthenticationError):
        DataKey.new("s1").open_text("e1", "payload", text)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
)


@given(_JSON)
def test_no_json_text_looks_sealed(value: object) -> None:
    assert not is_sealed_text(orjson.dumps(value).decode())


@pytest.mark.parametrize("size", [0, 7, 12, 28])
def test_a_wrapped_key_too_short_to_hold_a_nonce_and_tag_is_refused_typed(size: int) -> None:
    """Cut below 8 bytes, ``cryptography`` refused the nonce with a bare
    ``ValueError`` (attack F5)."""
    provider = _provider("a")
    wrapped = provider.wrap(b"k" * 32, wrap_context("s1", 1))
    with pytest.raises(KeyUnwrapError):
        provider.unwrap(wrapped[:size], "a", wrap_context("s1", 1))
