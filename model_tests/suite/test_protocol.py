"""``storage/protocol.py`` states the whole contract: every area object of a
store has exactly its protocol's public methods, with the same parameters, and
``Store`` names every area and every public method of the store itself (an
attack helper found ``set_label``, ``set_title`` and the store's own reads
missing from it)."""

from __future__ import annotations

import inspect
from typing import Any

import turnkeeper
from turnkeeper.storage import protocol


def _public(cls: Any) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def _protocol_of(cls: Any) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in vars(cls).items()
        if inspect.isfunction(fn) and not name.startswith("_")
    }


def test_every_area_has_exactly_its_protocols_methods() -> None:
    with turnkeeper.open_store(":memory:") as store:
        areas = {name: area for name, area in vars(store).items() if name != "db"}
        declared = {
            name: member.fget.__annotations__["return"]
            for name, member in vars(protocol.Store).items()
            if isinstance(member, property) and name != "path"
        }
        assert set(areas) == set(declared)
        for name, area in areas.items():
            proto = getattr(protocol, declared[name])
            want, have = _protocol_of(proto), _public(type(area))
            assert set(want) == set(have), (name, set(want) ^ set(have))
            for method, signature in want.items():
                # the same parameters, names, kinds and defaults (annotations are
                # text; a protocol's ``...`` default stands for any default)
                got = list(have[method].parameters.values())
                assert [(p.name, p.kind) for p in signature.parameters.values()] == [
                    (p.name, p.kind) for p in got
                ], f"{name}.{method}"
                for p, q in zip(signature.parameters.values(), got, strict=True):
                    if p.default is Ellipsis:
                        assert q.default is not inspect.Parameter.empty, f"{name}.{method}"
                    else:
                        assert p.default == q.default, f"{name}.{method}({p.name})"


def test_the_store_protocol_names_every_public_method_of_the_store() -> None:
    own = {
        name
        for name, member in vars(turnkeeper.BaseStore).items()
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
    }
    stated = {name for name in vars(protocol.Store) if not name.startswith("_")}
    assert own <= stated, own - stated
