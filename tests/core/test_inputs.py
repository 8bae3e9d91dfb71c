"""The TypedDicts of pai_storage.inputs describe exactly the models' JSON forms."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from pydantic import BaseModel

import pai_storage
from pai_storage import inputs as i
from pai_storage import models as m

PAIRS: list[tuple[Any, type[BaseModel]]] = [
    (i.ThreadVersionJSON, m.ThreadVersion),
    (i.PageRequestJSON, m.PageRequest),
    (i.MessageIdsSelectionJSON, m.MessageIdsSelection),
    (i.MessagePageSelectionJSON, m.MessagePageSelection),
    (i.RunIdsSelectionJSON, m.RunIdsSelection),
    (i.RunPageSelectionJSON, m.RunPageSelection),
    (i.QueuedItemIdsSelectionJSON, m.QueuedItemIdsSelection),
    (i.QueuedItemPageSelectionJSON, m.QueuedItemPageSelection),
    (i.ReadIncludeJSON, m.ReadInclude),
    (i.ReadThreadJSON, m.ReadThreadInput),
    (i.ListThreadsJSON, m.ListThreadsInput),
    (i.TextPartJSON, m.TextPart),
    (i.ReasoningPartJSON, m.ReasoningPart),
    (i.FilePartJSON, m.FilePart),
    (i.ToolCallPartJSON, m.ToolCallPart),
    (i.DataPartJSON, m.DataPart),
    (i.ProducerJSON, m.Producer),
    (i.StandaloneAssociationJSON, m.StandaloneAssociation),
    (i.RunAssociationJSON, m.RunAssociation),
    (i.VisibilityJSON, m.Visibility),
    (i.MessageDraftJSON, m.MessageDraft),
    (i.RunInitiatorJSON, m.RunInitiator),
    (i.AdmissionDraftJSON, m.AdmissionDraft),
    (i.RunErrorJSON, m.RunError),
    (i.RunDraftJSON, m.RunDraft),
    (i.QueuedItemDraftJSON, m.QueuedItemDraft),
    (i.CreateRootJSON, m.CreateRoot),
    (i.UpdateRootJSON, m.UpdateRoot),
    (i.DeleteChangeJSON, m.DeleteChange),
    (i.TruncateChangeJSON, m.TruncateChange),
    (i.LeaseRefJSON, m.LeaseRef),
    (i.AcquireLeaseJSON, m.AcquireLease),
    (i.RenewLeaseJSON, m.RenewLease),
    (i.ReleaseLeaseJSON, m.ReleaseLease),
    (i.ThreadChangesJSON, m.ThreadChanges),
    (i.MissingConditionJSON, m.MissingCondition),
    (i.VersionConditionJSON, m.VersionCondition),
    (i.CreateMutationJSON, m.CreateMutation),
    (i.UpdateMutationJSON, m.UpdateMutation),
    (i.DeleteMutationJSON, m.DeleteMutation),
    (i.CommitThreadJSON, m.CommitThreadInput),
]


def _json_keys(model: type[BaseModel]) -> tuple[set[str], set[str]]:
    """(every key, the required keys) of the model's JSON form."""
    keys, required = set(), set()
    for name, info in model.model_fields.items():
        key = info.alias or name
        keys.add(key)
        if info.is_required():
            required.add(key)
    return keys, required


@pytest.mark.parametrize(("typed", "model"), PAIRS, ids=[t.__name__ for t, _ in PAIRS])
def test_each_typed_dict_has_the_models_keys(typed: Any, model: type[BaseModel]) -> None:
    keys, required = _json_keys(model)
    assert set(typing.get_type_hints(typed)) == keys
    assert set(typed.__required_keys__) == required


def test_every_input_model_of_a_commit_is_described() -> None:
    described = {model for _, model in PAIRS}
    for name in ("InsertChange", "ReplaceChange"):  # generic: MessageInsertJSON & co.
        assert hasattr(m, name)
    assert m.CommitThreadInput in described
    assert set(i.__all__) <= set(dir(i))


@pytest.mark.asyncio
async def test_a_typed_commit_read_and_list_run_as_written() -> None:
    commit: i.CommitThreadJSON = {
        "scopeKey": "tenant-42",
        "threadId": "chat-1",
        "condition": {"type": "missing"},
        "mutation": {
            "type": "create",
            "root": {
                "agent": "assistant",
                "directExecutionAllowed": True,
                "listVisibility": "visible",
                "metadata": {},
                "privateMetadata": {},
                "title": "Trip",
            },
        },
    }
    read: i.ReadThreadJSON = {"scopeKey": "tenant-42", "threadId": "chat-1"}
    listed: i.ListThreadsJSON = {"scopeKey": "tenant-42", "limit": 10}
    async with pai_storage.open_store("memory://") as store:
        assert (await store.commit_thread(commit)).type == "committed"
        thread = (await store.read_thread(read)).thread
        assert thread is not None
        assert thread.title == "Trip"
        assert [t.thread_id for t in (await store.list_threads(listed)).items] == ["chat-1"]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (
            {"scopeKey": "a", "threadId": "t", "condition": {}, "mutation": {"type": "delete"}},
            "condition: the 'type' field is missing",
        ),
        (
            {"scopeKey": "a", "threadId": "t", "condition": {"type": "nope"}},
            "condition: unknown type (expected one of 'missing', 'version')",
        ),
        (
            {"scopeKey": "a", "limit": 3, "limt": 3},
            "limt: an unknown field",
        ),
        ({"scopeKey": "a"}, "threadId: a required field is missing"),
    ],
)
def test_validation_messages_are_plain_words(data: dict[str, Any], words: str) -> None:
    model = m.ListThreadsInput if "limt" in data else m.CommitThreadInput
    with pytest.raises(pai_storage.InvalidInputError) as raised:
        model.model_validate(data)
    message = str(raised.value)
    assert words in message
    for jargon in ("discriminator", "Unable to extract", "Extra inputs", "Field required"):
        assert jargon not in message
