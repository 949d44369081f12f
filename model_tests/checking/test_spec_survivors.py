"""Fixed tests for the survivors of the second mutation net in ``spec/``
(``mutation_net/survivors.py`` names each one's mutant): pure functions of
``spec/``, no store, so every spec area of the net runs them first."""

from __future__ import annotations

import dataclasses
import pickle
from datetime import UTC, datetime
from typing import Any

import pytest

from turnkeeper.spec import records
from turnkeeper.spec.clear_facts import CUT, NAME_MAX, NONE, ClearFacts, bounded, clear_facts
from turnkeeper.spec.delivery import DeliveryIntent, DeliveryPlan, intent_status
from turnkeeper.spec.entries import validate_payload
from turnkeeper.spec.errors import (
    InvalidInputError,
    LeaseLostError,
    ToolCallPairingError,
    ToolCallsUnansweredError,
    ToolExecutionNotReclaimableError,
    TurnkeeperError,
)
from turnkeeper.spec.lifecycle import Edge, Lifecycle, fact
from turnkeeper.spec.records import Lease
from turnkeeper.spec.tool_execution import (
    ToolExecution,
    is_content,
    openai_content,
    recorded_result,
    result_json,
    unrecorded_interrupted_result,
)
from turnkeeper.spec.usage import (
    MAX_COST_USD,
    MAX_TOKENS,
    UsageFigures,
    check_cost,
    check_count,
    from_anthropic_message,
    from_pi_message,
    from_provider,
    lenient_cost,
    lenient_count,
    text_of,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _completed(result: Any) -> ToolExecution:
    return ToolExecution(
        execution_key="r1:c1", session_id="s", run_id="r1", local_turn_id="t1",
        provider="p", api="a", response_id="resp", provider_call_id="c1",
        tool_kind="function", tool_name="ls", args_digest="0" * 64, side_effecting=False,
        state="completed", result=result, is_error=False, provider_metadata=None,
        reason=None, attempt=1, lease_epoch=1, created_at=NOW, updated_at=NOW,
        completed_at=NOW,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("result", "kept"),
    [
        ("a.txt", False),
        ([{"type": "text", "text": "x"}], False),
        ({"code": 0}, True),
        ([1, 2], True),
        (None, True),
    ],
    ids=["text", "blocks", "object", "list-of-values", "null"],
)
def test_a_rebuilt_result_keeps_in_details_only_a_value_without_content_form(
    result: Any, kept: bool
) -> None:
    """``recorded_result``: text and content blocks are the content and nothing
    more; any other value is also kept as it is in ``details.result``."""
    details = recorded_result(_completed(result), 5)["details"]
    assert ("result" in details) == kept
    assert not kept or details["result"] == result


def test_content_blocks_are_a_list_of_objects_each_with_a_string_type() -> None:
    assert is_content([{"type": "text", "text": "x"}, {"type": "image"}])
    assert is_content([])
    assert not is_content([{"type": 1}])
    assert not is_content([{"text": "x"}])
    assert not is_content(["text"])
    assert not is_content({"type": "text"})


def test_an_openai_tool_message_carries_text_and_blocks_as_they_are_other_values_as_json() -> None:
    blocks = [{"type": "text", "text": "x"}]
    assert openai_content("a.txt") == "a.txt"
    assert openai_content(blocks) is blocks
    assert openai_content({"b": 1, "a": [2]}) == '{"a":[2],"b":1}'
    assert openai_content(3) == "3"


def test_result_json_sorts_keys_drops_spaces_and_keeps_non_ascii() -> None:
    assert result_json({"b": "é", "a": 1}) == '{"a":1,"b":"é"}'
    assert result_json([{"z": 1, "y": None}]) == '[{"y":null,"z":1}]'


def test_an_interrupted_result_without_a_record_says_it_has_none() -> None:
    message = unrecorded_interrupted_result("c1", "ls", 5)
    assert message["details"] == {"executionState": "interrupted", "recorded": False}
    assert message["isError"] is True


def _lifecycle(**changed: Any) -> Lifecycle:
    parts: dict[str, Any] = {
        "name": "t",
        "states": ("a", "b"),
        "initial": "a",
        "edges": (Edge("go", "go", "a", "b", guards=("ok",), unless=("no",)),),
        "guards": {"ok": (fact("ok"), "ok"), "no": (fact("no"), "no")},
        "invariants": (),
    }
    return Lifecycle(**{**parts, **changed})


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"edges": (Edge("go", "go", "a", "b"), Edge("go", "back", "b", "a"))}, "unique"),
        ({"edges": (Edge("go", "go", "x", "b"),)}, "unknown state"),
        ({"edges": (Edge("go", "go", "a", "x"),)}, "unknown state"),
        ({"edges": (Edge("go", "go", "a", "b", guards=("ok", "gone")),)}, "unknown guard gone"),
        ({"edges": (Edge("go", "go", "a", "b", unless=("gone",)),)}, "unknown guard gone"),
        ({"initial": "x"}, "unknown initial state"),
    ],
    ids=["same-name", "source", "dest", "guard", "unless", "initial"],
)
def test_a_lifecycle_refuses_malformed_data(changed: dict[str, Any], message: str) -> None:
    """Each check of ``Lifecycle.__post_init__`` alone (one flaw per case), and a
    well-formed twin accepted."""
    with pytest.raises(ValueError, match=message):
        _lifecycle(**changed)
    assert _lifecycle().edge("go").dest == "b"


def test_a_lifecycle_finds_edges_by_name_and_selects_by_facts() -> None:
    two = _lifecycle(
        edges=(Edge("stay", "go", "a", "a", guards=("no",)), Edge("go", "go", "a", "b")),
    )
    assert two.edge("go").name == "go" and two.edge("stay").name == "stay"
    with pytest.raises(KeyError):
        two.edge("gone")
    assert two.select("go", "a", {"no": True}).name == "stay"  # type: ignore[union-attr]
    assert two.select("go", "a", {}).name == "go"  # type: ignore[union-attr]
    assert two.select("go", "b", {}) is None
    assert two.triggers == ("go",)
    one = _lifecycle()
    assert one.allowed(one.edge("go"), {"ok": True})
    assert not one.allowed(one.edge("go"), {"ok": True, "no": True})
    assert not one.allowed(one.edge("go"), {"ok": 1})  # a fact is true only when it is True
    assert not one.allowed(one.edge("go"), {})


def test_an_error_sets_its_fields_from_positions_and_names_and_refuses_others() -> None:
    lost = LeaseLostError("session:s")
    assert lost.target == "session:s" and lost.detail is None
    doc = "The caller no longer owns the lease (expired, released or taken over)"
    assert str(lost) == f"{doc} (target='session:s')"
    assert str(LeaseLostError(target="t", detail="why")).endswith("(target='t'): why")
    assert LeaseLostError().target is None  # fewer positions than fields: the rest None
    with pytest.raises(TypeError, match="duplicate"):
        LeaseLostError("t", target="t")
    with pytest.raises(TypeError, match="unknown"):
        LeaseLostError(owner="o")
    assert str(TurnkeeperError()) == "Root of every error turnkeeper raises"
    back = pickle.loads(pickle.dumps(LeaseLostError("t", detail="d")))
    assert (type(back), back.target, back.detail) == (LeaseLostError, "t", "d")


@pytest.mark.parametrize(
    ("statuses", "aggregate"),
    [
        ((), "delivered"),
        (("delivered", "unsupported"), "delivered"),
        (("delivered", "pending"), "pending"),
        (("failed", "uncertain"), "failed"),
        (("delivered", "uncertain"), "uncertain"),
        (("failed", "claimed"), "pending"),
    ],
)
def test_an_intents_status_is_the_aggregate_of_its_operations(
    statuses: tuple[str, ...], aggregate: str
) -> None:
    assert intent_status(statuses) == aggregate


def test_a_reprs_never_show_a_lease_token_or_a_transport_context() -> None:
    lease = Lease("session:s", "o", "secret-token", 1, "execution", NOW)
    assert "secret-token" not in repr(lease) and "o" in repr(lease)
    plan = DeliveryPlan("p", "t", (), transport_context={"k": "secret-context"})
    assert "secret-context" not in repr(plan)
    intent = DeliveryIntent(
        "i", "s", "r", "p", "t", "", "pending", NOW, NOW, {"k": "secret-context"}
    )
    assert "secret-context" not in repr(intent)


def test_a_clear_fact_is_a_string_cut_past_its_bound() -> None:
    assert bounded(None) is None and bounded(3) is None and bounded(["a"]) is None
    assert bounded("x" * NAME_MAX) == "x" * NAME_MAX
    assert bounded("x" * (NAME_MAX + 1)) == "x" * (NAME_MAX - 1) + CUT


def test_clear_facts_per_kind() -> None:
    said = {"message": {"role": "assistant", "provider": "p", "model": "m"}}
    assert clear_facts("message", said) == ClearFacts("assistant", "p", "m")
    asked = {"message": {"role": "user", "provider": "p", "model": "m"}}
    assert clear_facts("message", asked) == ClearFacts("user")
    assert clear_facts("message", {"message": "text"}) == NONE
    assert clear_facts("message", {}) == NONE
    changed = {"provider": "p", "model": "old", "modelId": "new"}
    assert clear_facts("model_change", changed) == ClearFacts(None, "p", "new")
    assert clear_facts("model_change", {**changed, "modelId": None}) == ClearFacts(None, "p", "old")
    assert clear_facts("custom", said) == NONE


@pytest.mark.parametrize("kind", [5, None, "", "session"], ids=["int", "none", "empty", "session"])
def test_an_entry_kind_that_is_no_kind_is_refused_even_when_unknown_kinds_pass(kind: Any) -> None:
    """``strict=False`` (imports) keeps unknown kinds, never a non-string, empty
    or ``session`` kind (its own check, not the unknown-kind one)."""
    with pytest.raises(InvalidInputError, match="not an entry kind"):
        validate_payload(kind, {}, strict=False)
    validate_payload("pi_extension", {}, strict=False)


def test_only_a_label_entry_needs_its_label_to_be_a_string() -> None:
    with pytest.raises(InvalidInputError, match="a label is a string"):
        validate_payload("label", {"targetId": "e1", "label": 3})
    validate_payload("label", {"targetId": "e1"})
    validate_payload("message", {"message": {"role": "user"}, "label": 3})


def test_every_flag_a_caller_leaves_out_of_a_record_is_off() -> None:
    """Each ``bool`` field of ``spec.records`` with a default defaults to False
    (a feature, a cancel request, an archive, a pin: never on unasked)."""
    flags = [
        (cls.__name__, f.name, f.default)
        for cls in vars(records).values()
        if dataclasses.is_dataclass(cls) and isinstance(cls, type)
        for f in dataclasses.fields(cls)
        if f.type in (bool, "bool") and f.default is not dataclasses.MISSING
    ]
    assert ("SessionCapabilities", "multi_agent", False) in flags
    assert ("ResponseRun", "cancel_requested", False) in flags
    assert [f for f in flags if f[2] is not False] == []
    capabilities = records.SessionCapabilities("s")
    assert not any(getattr(capabilities, n) for n in ("delegate_mode", "multi_agent", "browser"))


def test_a_refused_reclaim_says_what_to_do_for_each_state() -> None:
    says = {
        ("completed", "terminal"): "never reopened: use its stored result",
        ("abandoned", "terminal"): "never reopened: a new run makes a new call",
        ("running", "needs_confirmation"): "(tools.request_recovery, once the record is inter",
        ("interrupted", "needs_confirmation"): "user confirms (tools.request_recovery) (",
    }
    for (source, reason), text in says.items():
        assert text in str(ToolExecutionNotReclaimableError("k", source, reason)), source
    refused = ToolExecutionNotReclaimableError("k", "abandoned", "terminal")
    assert str(refused).endswith("reason='terminal')")
    refused = ToolExecutionNotReclaimableError("k", "abandoned", "terminal", detail="more")
    assert str(refused).endswith("reason='terminal'): more")


def test_a_pairing_error_names_the_first_open_call_and_keeps_its_detail() -> None:
    open_calls = ToolCallsUnansweredError("s", "e", ["c1", "c2"])
    assert open_calls.tool_call_id == "c1" and open_calls.tool_call_ids == ("c1", "c2")
    assert ToolCallsUnansweredError("s", "e", []).tool_call_id == ""
    assert str(open_calls).endswith("at the run's end)")
    assert str(ToolCallsUnansweredError("s", "e", ["c1"], detail="more")).endswith("end): more")
    plain = ToolCallPairingError("s", "e", "c1", "late")
    assert str(plain).endswith("reason='late')")
    detailed = ToolCallPairingError("s", "e", "c1", "late", detail="more")
    assert str(detailed).endswith("reason='late'): more")


def test_usage_figures_are_taken_up_to_their_bounds_inclusive() -> None:
    """The bounds of counts and costs, read leniently from a file (``None`` =
    unknown) and checked strictly from a caller (refused), at each edge."""
    assert lenient_count(0) == 0 and lenient_count(MAX_TOKENS) == MAX_TOKENS
    assert lenient_count(3.0) == 3 and lenient_count(3.5) is None
    assert lenient_count(float("inf")) is None and lenient_count(float("nan")) is None
    assert lenient_count(-1) is None and lenient_count(MAX_TOKENS + 1) is None
    assert lenient_count(True) is None and lenient_count("3") is None
    assert lenient_cost(0) == 0.0 and lenient_cost(MAX_COST_USD) == MAX_COST_USD
    assert lenient_cost(0.25) == 0.25 and lenient_cost(-0.01) is None
    assert lenient_cost(MAX_COST_USD * 2) is None and lenient_cost(float("nan")) is None
    assert check_count(0, "f") == 0 and check_count(MAX_TOKENS, "f") == MAX_TOKENS
    assert check_cost(0, "f") == 0.0 and check_cost(MAX_COST_USD, "f") == MAX_COST_USD
    for bad_count in (-1, MAX_TOKENS + 1, True, 1.0):
        with pytest.raises(InvalidInputError):
            check_count(bad_count, "f")
    for bad_cost in (-0.01, MAX_COST_USD * 2, float("inf"), True, "1"):
        with pytest.raises(InvalidInputError):
            check_cost(bad_cost, "f")


def test_usage_is_read_from_assistant_messages_only_and_totals_only_known_parts() -> None:
    pi = {"role": "assistant", "usage": {"input": 3, "output": 4, "cost": {"total": 0.5}}}
    figures = from_pi_message(pi)
    assert figures is not None
    assert (figures.input_tokens, figures.output_tokens, figures.cost_usd) == (3, 4, 0.5)
    assert from_pi_message({**pi, "role": "user"}) is None
    assert from_pi_message({**pi, "usage": {}}) is None
    assert from_pi_message({**pi, "usage": "3"}) is None
    assert from_pi_message("assistant") is None
    claude = {"role": "assistant", "usage": {"input_tokens": 3, "output_tokens": 4}}
    assert from_anthropic_message(claude) == UsageFigures(3, 4, 0, 0, 7, None)
    odd = {**claude, "usage": {"input_tokens": 3, "output_tokens": "4"}}
    assert from_anthropic_message(odd) == UsageFigures(3, None, 0, 0, None, None)
    assert from_anthropic_message({**claude, "role": "user"}) is None
    assert from_anthropic_message({**claude, "usage": {"cache_read_input_tokens": 1}}) is None
    assert from_anthropic_message(None) is None


def test_a_usage_object_of_no_shape_or_two_says_which_it_found() -> None:
    with pytest.raises(InvalidInputError, match="shape, found none"):
        from_provider({"tokens": 3})
    with pytest.raises(InvalidInputError, match="shape, found chat and messages"):
        from_provider({"prompt_tokens": 3, "input_tokens": 3})


def test_text_of_is_a_string_field_or_empty() -> None:
    assert text_of({"model": "m"}, "model") == "m"
    assert text_of({"model": 3}, "model") == ""
    assert text_of({}, "model") == ""


def test_usage_at_the_edges_a_total_at_the_bound_and_a_prompt_all_cached() -> None:
    at_bound = {"role": "assistant", "usage": {"input_tokens": MAX_TOKENS, "output_tokens": 0}}
    assert from_anthropic_message(at_bound) == UsageFigures(MAX_TOKENS, 0, 0, 0, MAX_TOKENS, None)
    past = {"role": "assistant", "usage": {"input_tokens": MAX_TOKENS, "output_tokens": 1}}
    assert from_anthropic_message(past) == UsageFigures(MAX_TOKENS, 1, 0, 0, None, None)
    cached = {
        "prompt_tokens": 5,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 5},
    }
    assert from_provider(cached) == UsageFigures(0, 1, 5, 0, 6)
    with pytest.raises(InvalidInputError, match="6 cached tokens of a 5-token prompt"):
        from_provider({**cached, "prompt_tokens_details": {"cached_tokens": 6}})
