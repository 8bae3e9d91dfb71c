"""Every record and input of the contract, as immutable pydantic models.

Python attributes are snake_case; the JSON form (the wire and persisted form,
``docs/data-model.md``) is camelCase. ``Model.model_validate(json)`` accepts
exactly the JSON form (snake_case names are accepted too), and
``model_dump(mode="json")`` produces it: optional fields are omitted when
absent, never written as null. Unknown fields and unknown part types are
rejected.

Validation failures raise :class:`ThreadStoreInvariantError` (a ``ValueError``)
naming the path of the bad field; a value that is not strict JSON raises
:class:`ThreadStoreSerializationError`. Error messages never echo input values.

Models are deeply immutable. Opaque JSON values (metadata, private metadata,
tool input and output, provider metadata, queued input, data parts) are
copied while they are checked into read-only containers, and every list a
model holds is read-only (:mod:`pai_storage.frozen`): a model never holds the
caller's ``dict`` or ``list``, and changing what a model holds raises
``TypeError``. Records can therefore be shared by every reader, never copied.

The field types and checks are in :mod:`pai_storage.fields`; stored data
becomes records, and records stored text, in :mod:`pai_storage.codec`.

Timestamps are aware UTC datetimes truncated to milliseconds; in JSON they are
ISO 8601 strings with milliseconds and ``Z``.

Limits
------
Every backend refuses the same inputs, with the same error, before anything is
written:

=============================================  ======================================
field                                          limit
=============================================  ======================================
``scopeKey``, ``threadId``, every record id,   1 to 1,024 characters
lease owner and producer/initiator ids
``agent`` (commit root and list filter)        1 character to 256 bytes of UTF-8
``parentThreadId`` (commit root, list filter)  1 character to 256 bytes of UTF-8
``category`` (commit root and list filter)     at most 256 bytes of UTF-8
``version.revision``                           1 to 2**63 - 1
``limit`` of a page or list                    1 to 100
``ids`` of an ids selection                    1 to 100, distinct
``durationMs`` of a lease                      1 to 86,400,000 (one day)
an opaque JSON value                           strict JSON, 64 levels, 1,000,000 values
=============================================  ======================================

``agent``, ``parentThreadId`` and ``category`` are the text fields the list
indexes hold besides the scope key and thread id. Their limit is in UTF-8
bytes, not characters, because that is what an index entry holds: with the
scope key and thread id at their longest ASCII form, an entry holding the
agent and the parent (or category) at 256 bytes each still fits PostgreSQL's
2,704-byte index entry. (Ids of up to 1,024 *non-ASCII* characters can still
exceed it there; see ``docs/postgres.md``.) Stored records read back are not
held to these input limits.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Generic, Literal, Self, TypeVar, cast

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from . import codec
from .conflicts import Conflict
from .fields import (
    MAX_DURATION_MS,
    MAX_ID_LENGTH,
    MAX_ID_SELECTION_SIZE,
    MAX_INDEXED_TEXT_BYTES,
    MAX_PAGE_SIZE,
    Id,
    IndexedId,
    IndexedText,
    Items,
    Json,
    JsonObject,
    Limit,
    ListVisibility,
    Operation,
    Order,
    RunStatus,
    Text,
    Timestamp,
    convert_validation_error,
)
from .strict_json import INT64_MAX

__all__ = [
    "MAX_DURATION_MS",
    "MAX_ID_LENGTH",
    "MAX_ID_SELECTION_SIZE",
    "MAX_INDEXED_TEXT_BYTES",
    "MAX_PAGE_SIZE",
    "AcquireLease",
    "Admission",
    "AdmissionDraft",
    "CommitThreadInput",
    "CommitThreadResult",
    "CommittedResult",
    "ConflictResult",
    "CreateMutation",
    "CreateRoot",
    "DataPart",
    "DeleteChange",
    "DeleteMutation",
    "FilePart",
    "InsertChange",
    "Json",
    "JsonObject",
    "LeaseChange",
    "LeaseRef",
    "ListThreadsInput",
    "Message",
    "MessageChange",
    "MessageDraft",
    "MessageIdsSelection",
    "MessagePageSelection",
    "MessageSelection",
    "MissingCondition",
    "Page",
    "PageRequest",
    "Part",
    "Producer",
    "QueuedItem",
    "QueuedItemChange",
    "QueuedItemDraft",
    "QueuedItemIdsSelection",
    "QueuedItemPageSelection",
    "QueuedItemSelection",
    "ReadInclude",
    "ReadThreadInput",
    "ReasoningPart",
    "ReleaseLease",
    "RenewLease",
    "ReplaceChange",
    "RunAssociation",
    "RunChange",
    "RunDraft",
    "RunError",
    "RunIdsSelection",
    "RunInitiator",
    "RunPageSelection",
    "RunRecord",
    "RunSelection",
    "RunStatus",
    "StandaloneAssociation",
    "TextPart",
    "ThreadChanges",
    "ThreadLease",
    "ThreadPage",
    "ThreadReadResult",
    "ThreadRecord",
    "ThreadVersion",
    "Timestamp",
    "ToolCallPart",
    "TruncateChange",
    "UpdateMutation",
    "UpdateRoot",
    "VersionCondition",
    "Visibility",
]

T = TypeVar("T")
D = TypeVar("D")


_OPAQUE_FIELDS = frozenset(
    {
        "metadata",
        "private_metadata",
        "provider_metadata",
        "call_provider_metadata",
        "result_provider_metadata",
        "input",
        "output",
        "data",
    }
)


class _Opaque:
    """Stands in for an opaque JSON value in a repr."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    def __repr__(self) -> str:
        value = self._value
        if isinstance(value, dict):
            return f"<object: {len(value)} keys>"
        if isinstance(value, list):
            return f"<array: {len(value)} items>"
        return "<json>" if value is not None else "None"


class StoreModel(BaseModel):
    """Base of every model: deeply immutable, strict, camelCase JSON, absent fields omitted.

    Immutable all the way down: fields cannot be set, and the lists and JSON
    objects a model holds are read-only (:mod:`pai_storage.frozen`); changing
    one raises ``TypeError``. A changed record is a new one
    (``model_copy(update=...)``, or a draft and the builders).
    """

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        revalidate_instances="always",
    )

    # Optional fields whose JSON value may itself be null: omitted only when unset
    # (codec.json_shape says which fields the JSON form carries).
    _json_optional: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise convert_validation_error(exc, type(self).__name__, data) from None

    # Tell pydantic this __init__ only converts errors, so nested models are
    # still validated by pydantic-core directly (not through __init__).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def trusted(cls, fields: dict[str, Any]) -> Self:
        """A model of ``fields`` that were already checked, built without validation.

        For a store's hot paths: every field has been validated (or was built
        by the store itself, read-only like validation makes it) and
        ``fields`` holds every field of the model, in the model's field order
        (the JSON form follows it). Several times cheaper than
        ``model_construct``; the result is the same frozen model.

        Its fields set are the ones its JSON form carries
        (:func:`~pai_storage.codec.json_shape`: an optional field left ``None``
        is unset; one whose JSON value may be null is set), as decoding that
        form would set them.
        """
        model = _new(cls)
        _set(model, "__dict__", fields)
        fields_set = set(fields)
        for name, _ in codec.json_shape(cls).when_not_none:
            if fields[name] is None:
                fields_set.discard(name)
        _set(model, "__pydantic_fields_set__", fields_set)
        _set(model, "__pydantic_extra__", None)
        _set(model, "__pydantic_private__", None)
        return model

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Self:
        try:
            if not kwargs:  # the common call: straight to pydantic-core
                return cast(Self, cls.__pydantic_validator__.validate_python(obj))
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            raise convert_validation_error(exc, cls.__name__, obj) from None

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **kwargs: Any) -> Self:
        try:
            return super().model_validate_json(json_data, **kwargs)
        except ValidationError as exc:
            try:
                data = json.loads(json_data)
            except ValueError:
                data = None
            raise convert_validation_error(exc, cls.__name__, data) from None

    @property
    def model_fields_set(self) -> set[str]:
        """The fields set explicitly (a copy: changing it changes nothing)."""
        return set(self.__pydantic_fields_set__)

    @model_serializer(mode="wrap")
    def _omit_absent(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        values = self.__dict__
        shape = codec.json_shape(type(self))
        for name, alias in shape.when_not_none:
            if values[name] is None:
                _drop(data, name, alias)
        fields_set = self.__pydantic_fields_set__
        for name, alias in shape.when_set:
            if name not in fields_set:
                _drop(data, name, alias)
        return data

    def __repr_args__(self) -> Any:
        # Opaque JSON may hold personal data: reprs (and so logs) show only its shape.
        for name, value in super().__repr_args__():
            yield name, (_Opaque(value) if name in _OPAQUE_FIELDS else value)

    def to_json(self) -> dict[str, Any]:
        """The JSON form of this value (a fresh, changeable ``dict``).

        The same as ``model_dump(mode="json", by_alias=True)``, about twice as fast.
        """
        return codec.json_form(self)

    def to_json_text(self) -> str:
        """The JSON form as compact text (what :meth:`to_json` gives, encoded by pydantic-core)."""
        return codec.json_text(self)


_new = object.__new__
_set = object.__setattr__


def _drop(data: dict[str, Any], name: str, alias: str | None) -> None:
    # Keys are aliases or names depending on the call and the config.
    data.pop(name, None)
    if alias:
        data.pop(alias, None)


# ---------------------------------------------------------------- thread root


class ThreadVersion(StoreModel):
    """The optimistic-concurrency token: incarnation plus revision (1 to 2**63 - 1)."""

    thread_instance_id: Id
    revision: Annotated[StrictInt, Field(ge=1, le=INT64_MAX)]


class ThreadLease(StoreModel):
    """The active-run lease: owner-fenced, expiring on the provider's clock."""

    kind: Literal["run"]
    run_id: Id
    owner_id: Id
    operation: Operation
    acquired_at: Timestamp
    renewed_at: Timestamp | None = None
    expires_at: Timestamp


class ThreadRecord(StoreModel):
    """A thread root as stored. ``updated_at`` is the last commit's ``committed_at``."""

    scope_key: Id
    thread_id: Id
    version: ThreadVersion
    agent: Id
    direct_execution_allowed: StrictBool
    parent_thread_id: Id | None = None
    list_visibility: ListVisibility
    category: Text | None = None
    title: Text | None = None
    metadata: JsonObject
    private_metadata: JsonObject
    lease: ThreadLease | None = None
    created_at: Timestamp
    updated_at: Timestamp

    def public_json(self) -> dict[str, Any]:
        """The JSON form without the server-only ``privateMetadata``."""
        data = self.to_json()
        del data["privateMetadata"]
        return data


# ---------------------------------------------------------------- messages


class _PartBase(StoreModel):
    pass


class TextPart(_PartBase):
    type: Literal["text"]
    text: Text
    provider_metadata: JsonObject | None = None


class ReasoningPart(_PartBase):
    type: Literal["reasoning"]
    text: Text
    provider_metadata: JsonObject | None = None


class FilePart(_PartBase):
    type: Literal["file"]
    media_type: Text
    url: Text
    filename: Text | None = None
    provider_metadata: JsonObject | None = None


class ToolCallPart(_PartBase):
    _json_optional: ClassVar[frozenset[str]] = frozenset({"output"})

    type: Literal["tool-call"]
    tool_call_id: Id
    tool_name: Text
    input: Json
    state: Literal["input-streaming", "input-available", "output-available", "output-error"]
    output: Json = None
    error_text: Text | None = None
    call_provider_metadata: JsonObject | None = None
    result_provider_metadata: JsonObject | None = None


class DataPart(_PartBase):
    type: Literal["data"]
    name: Text
    data: Json


Part = Annotated[
    TextPart | ReasoningPart | FilePart | ToolCallPart | DataPart, Field(discriminator="type")
]


class Producer(StoreModel):
    kind: Literal["user", "agent", "system", "application"]
    id: Id | None = None


class StandaloneAssociation(StoreModel):
    kind: Literal["standalone"]


class RunAssociation(StoreModel):
    kind: Literal["run"]
    run_id: Id
    relation: Literal["input", "context", "output"]


Association = Annotated[StandaloneAssociation | RunAssociation, Field(discriminator="kind")]


class Visibility(StoreModel):
    transcript: StrictBool
    context: StrictBool


class _MessageFields(StoreModel):
    message_id: Id
    role: Literal["user", "assistant", "system", "tool"]
    parts: Annotated[Items[Part], Field(min_length=1)]
    producer: Producer
    association: Association
    visibility: Visibility
    status: Literal["complete", "streaming", "incomplete", "error"]
    metadata: JsonObject

    @property
    def run_id(self) -> str | None:
        """The run this message belongs to, or ``None`` when standalone."""
        assoc = self.association
        return assoc.run_id if isinstance(assoc, RunAssociation) else None

    @property
    def text(self) -> str:
        """The message's words: its text parts joined, in order (``""`` without any)."""
        return "".join(part.text for part in self.parts if isinstance(part, TextPart))


class MessageDraft(_MessageFields):
    """A message as callers insert or replace it."""


class Message(_MessageFields):
    """A stored message: the draft plus ``created_at`` and ``updated_at``."""

    created_at: Timestamp
    updated_at: Timestamp

    def to_draft(self) -> MessageDraft:
        """The draft of this message, e.g. to replace it with changes."""
        return MessageDraft.model_validate(
            self.model_dump(exclude={"created_at", "updated_at"}, by_alias=False)
        )


# ---------------------------------------------------------------- runs


class RunInitiator(StoreModel):
    kind: Literal["user", "agent", "system", "trigger"]
    id: Id | None = None


class AdmissionDraft(StoreModel):
    queue_item_id: Id | None = None
    admitted: StrictBool


class Admission(StoreModel):
    queue_item_id: Id | None = None
    admitted: StrictBool
    admitted_at: Timestamp | None = None


class RunError(StoreModel):
    code: Text
    message: Text


class _RunFields(StoreModel):
    run_id: Id
    status: RunStatus
    initiator: RunInitiator
    input_message_ids: Items[Id]
    operation: Operation | None = None
    error: RunError | None = None
    metadata: JsonObject
    private_metadata: JsonObject


class RunDraft(_RunFields):
    """A run lifecycle record as callers insert or replace it."""

    admission: AdmissionDraft


class RunRecord(_RunFields):
    """A stored run: ``admission.admitted_at`` and ``finished_at`` are stamped by commits."""

    admission: Admission
    created_at: Timestamp
    updated_at: Timestamp
    finished_at: Timestamp | None = None

    def to_draft(self) -> RunDraft:
        data = self.model_dump(exclude={"created_at", "updated_at", "finished_at"}, by_alias=False)
        data["admission"].pop("admitted_at", None)
        return RunDraft.model_validate(data)

    def public_json(self) -> dict[str, Any]:
        """The JSON form without the server-only ``privateMetadata``."""
        data = self.to_json()
        del data["privateMetadata"]
        return data


# ---------------------------------------------------------------- queued items


class QueuedItemDraft(StoreModel):
    queue_item_id: Id
    run_id: Id
    input: Json
    metadata: JsonObject


class QueuedItem(StoreModel):
    queue_item_id: Id
    run_id: Id
    input: Json
    metadata: JsonObject
    created_at: Timestamp

    def to_draft(self) -> QueuedItemDraft:
        return QueuedItemDraft.model_validate(
            self.model_dump(exclude={"created_at"}, by_alias=False)
        )


# ---------------------------------------------------------------- reads


def _distinct(ids: list[str]) -> list[str]:
    if len(set(ids)) != len(ids):
        raise PydanticCustomError("duplicate_id", "ids must be distinct")
    return ids


IdSelection = Annotated[
    Items[Id], Field(min_length=1, max_length=MAX_ID_SELECTION_SIZE), AfterValidator(_distinct)
]


class PageRequest(StoreModel):
    limit: Limit
    page_token: StrictStr | None = None


class MessageIdsSelection(StoreModel):
    type: Literal["ids"]
    message_ids: IdSelection


class MessagePageSelection(StoreModel):
    type: Literal["page"]
    view: Literal["raw", "transcript", "context"]
    order: Order | None = None
    after_message_id: Id | None = None
    before_message_id: Id | None = None
    page: PageRequest


MessageSelection = Annotated[
    MessageIdsSelection | MessagePageSelection, Field(discriminator="type")
]


class RunIdsSelection(StoreModel):
    type: Literal["ids"]
    run_ids: IdSelection


class RunPageSelection(StoreModel):
    type: Literal["page"]
    order: Order | None = None
    statuses: Annotated[Items[RunStatus], Field(min_length=1)] | None = None
    page: PageRequest


RunSelection = Annotated[RunIdsSelection | RunPageSelection, Field(discriminator="type")]


class QueuedItemIdsSelection(StoreModel):
    type: Literal["ids"]
    queue_item_ids: IdSelection


class QueuedItemPageSelection(StoreModel):
    type: Literal["page"]
    order: Order | None = None
    run_id: Id | None = None
    page: PageRequest


QueuedItemSelection = Annotated[
    QueuedItemIdsSelection | QueuedItemPageSelection, Field(discriminator="type")
]


class ReadInclude(StoreModel):
    messages: MessageSelection | None = None
    runs: RunSelection | None = None
    queued_items: QueuedItemSelection | None = None


class ReadThreadInput(StoreModel):
    scope_key: Id
    thread_id: Id
    include: ReadInclude | None = None


class Page(StoreModel, Generic[T]):
    items: Items[T]
    next_page_token: StrictStr | None = None


class ThreadPage(Page[T], Generic[T]):
    version: ThreadVersion


class ThreadReadResult(StoreModel):
    observed_at: Timestamp
    thread: ThreadRecord | None
    messages: ThreadPage[Message] | None = None
    runs: ThreadPage[RunRecord] | None = None
    queued_items: ThreadPage[QueuedItem] | None = None


# ---------------------------------------------------------------- listing


class ListThreadsInput(StoreModel):
    scope_key: Id
    limit: Limit
    agent: IndexedId | None = None
    parent_thread_id: IndexedId | None = None
    category: IndexedText | None = None
    include_hidden: StrictBool | None = None
    page_token: StrictStr | None = None


# ---------------------------------------------------------------- commits


class MissingCondition(StoreModel):
    type: Literal["missing"]


class VersionCondition(StoreModel):
    type: Literal["version"]
    version: ThreadVersion


class CreateRoot(StoreModel):
    agent: IndexedId
    direct_execution_allowed: StrictBool
    parent_thread_id: IndexedId | None = None
    list_visibility: ListVisibility
    category: IndexedText | None = None
    title: Text | None = None
    metadata: JsonObject
    private_metadata: JsonObject


class UpdateRoot(StoreModel):
    """The complete set of mutable root fields; omitted ``category``/``title`` are removed."""

    list_visibility: ListVisibility
    category: IndexedText | None = None
    title: Text | None = None
    metadata: JsonObject
    private_metadata: JsonObject


class InsertChange(StoreModel, Generic[D]):
    """Append ``record`` at the end of its family; its id must be new."""

    type: Literal["insert"]
    record: D


class ReplaceChange(StoreModel, Generic[D]):
    """Replace the record with the same id; it must exist and keeps its position."""

    type: Literal["replace"]
    record: D


class DeleteChange(StoreModel):
    """Delete the record with this id; it must exist."""

    type: Literal["delete"]
    id: Id


class TruncateChange(StoreModel):
    """Remove every record after ``after_id`` (``None``: all). Messages and runs only."""

    type: Literal["truncate"]
    after_id: Id | None


MessageChange = Annotated[
    InsertChange[MessageDraft] | ReplaceChange[MessageDraft] | DeleteChange | TruncateChange,
    Field(discriminator="type"),
]
RunChange = Annotated[
    InsertChange[RunDraft] | ReplaceChange[RunDraft] | DeleteChange | TruncateChange,
    Field(discriminator="type"),
]
QueuedItemChange = Annotated[
    InsertChange[QueuedItemDraft] | ReplaceChange[QueuedItemDraft] | DeleteChange,
    Field(discriminator="type"),
]


class LeaseRef(StoreModel):
    kind: Literal["run"]
    run_id: Id


Duration = Annotated[StrictInt, Field(ge=1, le=MAX_DURATION_MS)]


class AcquireLease(StoreModel):
    """Take the lease; conflicts while another unexpired lease exists."""

    type: Literal["acquire"]
    lease: LeaseRef
    lease_owner_id: Id
    duration_ms: Duration
    operation: Operation


class RenewLease(StoreModel):
    """Extend the caller's own unexpired lease."""

    type: Literal["renew"]
    lease: LeaseRef
    lease_owner_id: Id
    duration_ms: Duration


class ReleaseLease(StoreModel):
    """Drop the caller's lease; ``expiry="any"`` also releases an expired one."""

    type: Literal["release"]
    lease: LeaseRef
    lease_owner_id: Id
    expiry: Literal["unexpired", "any"]


LeaseChange = Annotated[AcquireLease | RenewLease | ReleaseLease, Field(discriminator="type")]


class ThreadChanges(StoreModel):
    messages: Items[MessageChange] | None = None
    runs: Items[RunChange] | None = None
    queued_items: Items[QueuedItemChange] | None = None
    lease: LeaseChange | None = None


class CreateMutation(StoreModel):
    type: Literal["create"]
    root: CreateRoot
    changes: ThreadChanges | None = None


class UpdateMutation(StoreModel):
    type: Literal["update"]
    root: UpdateRoot
    changes: ThreadChanges | None = None


class DeleteMutation(StoreModel):
    type: Literal["delete"]


class CommitThreadInput(StoreModel):
    """One atomic, version-checked write set for one thread."""

    scope_key: Id
    thread_id: Id
    condition: Annotated[MissingCondition | VersionCondition, Field(discriminator="type")]
    mutation: Annotated[
        CreateMutation | UpdateMutation | DeleteMutation, Field(discriminator="type")
    ]

    @model_validator(mode="after")
    def _condition_matches_mutation(self) -> Self:
        creating = self.mutation.type == "create"
        if creating != (self.condition.type == "missing"):
            raise PydanticCustomError(
                "condition_mismatch",
                "a create needs condition 'missing'; an update or delete needs 'version'",
            )
        return self


class CommittedResult(StoreModel):
    type: Literal["committed"]
    thread: ThreadRecord | None
    committed_at: Timestamp


class ConflictResult(StoreModel, Conflict):
    type: Literal["conflict"]
    current_version: ThreadVersion | None


CommitThreadResult = Annotated[CommittedResult | ConflictResult, Field(discriminator="type")]


codec.prepare(ThreadRecord, Message, RunRecord, QueuedItem)
