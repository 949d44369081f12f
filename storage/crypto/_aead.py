"""The one import of the ``cryptography`` package, with a clear error when the
``encryption`` extra is not installed."""

from __future__ import annotations

from typing import Any

from turnkeeper.spec.errors import InterfaceError


def aesgcm(key: bytes) -> Any:
    """An ``AESGCM`` object for a 256-bit ``key`` (``cryptography``).

    Raises:
        InterfaceError: the ``cryptography`` package is missing.
    """
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:  # pragma: no cover - the extra is installed in tests
        raise InterfaceError(
            detail="encryption needs the cryptography package: pip install 'turnkeeper[encryption]'"
        ) from exc
    return AESGCM(key)


def invalid_tag() -> type[Exception]:
    """``cryptography``'s authentication failure (``InvalidTag``)."""
    from cryptography.exceptions import InvalidTag

    return InvalidTag
