"""Payload encryption at rest: envelope encryption with a data key per session.

``keys`` holds the key providers (the master key the user holds, and the
interface a KMS plugs into); ``seal`` seals and opens one stored value with
AES-GCM under a session's data key, bound to where it is stored. The
``cryptography`` package does every cipher operation (``pip install
turnkeeper[encryption]``); nothing here is cipher code of our own.
"""

from .keys import KeyProvider, LocalKeyProvider
from .seal import DataKey

__all__ = ["DataKey", "KeyProvider", "LocalKeyProvider"]
