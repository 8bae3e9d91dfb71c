"""The JSON input forms of the thread store's operations, as ``TypedDict``\\ s.

``read_thread``, ``list_threads`` and ``commit_thread`` accept their model
(:class:`~pai_storage.ReadThreadInput`, ...) or its JSON form, a plain
``dict``. These types describe that ``dict`` so an editor completes its keys
and a type checker catches a misspelt one::

    from pai_storage.inputs import CommitThreadJSON

    commit: CommitThreadJSON = {
        "scopeKey": "tenant-42",
        "threadId": "chat-1",
        "condition": {"type": "missing"},
        "mutation": {"type": "create", "root": {...}},
    }

They only describe: the store validates every input against the models
whatever its static type (``docs/data-model.md`` is the reference). Keys are
the camelCase JSON names; optional keys are ``NotRequired``.
"""

# No ``from __future__ import annotations`` here: with it, Python 3.11's TypedDict
# cannot see NotRequired, and every key would count as required at run time.
from typing import Any, Literal, NotRequired, TypeAlias, TypedDict

__all__ = [
    "AcquireLeaseJSON",
    "CommitThreadJSON",
    "CreateRootJSON",
    "DeleteChangeJSON",
    "ListThreadsJSON",
    "MessageChangeJSON",
    "MessageDraftJSON",
    "MessageSelectionJSON",
    "PageRequestJSON",
    "PartJSON",
    "QueuedItemChangeJSON",
    "QueuedItemDraftJSON",
    "QueuedItemSelectionJSON",
    "ReadIncludeJSON",
    "ReadThreadJSON",
    "ReleaseLeaseJSON",
    "RenewLeaseJSON",
    "RunChangeJSON",
    "RunDraftJSON",
    "RunSelectionJSON",
    "ThreadChangesJSON",
    "ThreadVersionJSON",
    "TruncateChangeJSON",
    "UpdateRootJSON",
]

Operation: TypeAlias = Literal["send", "trigger", "regenerate", "resume"]
RunStatus: TypeAlias = Literal["queued", "running", "waiting", "completed", "failed", "cancelled"]
Order: TypeAlias = Literal["oldest", "newest"]


class ThreadVersionJSON(TypedDict):
    threadInstanceId: str
    revision: int


# ---------------------------------------------------------------- reads


class PageRequestJSON(TypedDict):
    limit: int
    pageToken: NotRequired[str | None]


class MessageIdsSelectionJSON(TypedDict):
    type: Literal["ids"]
    messageIds: list[str]


class MessagePageSelectionJSON(TypedDict):
    type: Literal["page"]
    view: Literal["raw", "transcript", "context"]
    page: PageRequestJSON
    order: NotRequired[Order | None]
    afterMessageId: NotRequired[str | None]
    beforeMessageId: NotRequired[str | None]


MessageSelectionJSON: TypeAlias = MessageIdsSelectionJSON | MessagePageSelectionJSON


class RunIdsSelectionJSON(TypedDict):
    type: Literal["ids"]
    runIds: list[str]


class RunPageSelectionJSON(TypedDict):
    type: Literal["page"]
    page: PageRequestJSON
    order: NotRequired[Order | None]
    statuses: NotRequired[list[RunStatus] | None]


RunSelectionJSON: TypeAlias = RunIdsSelectionJSON | RunPageSelectionJSON


class QueuedItemIdsSelectionJSON(TypedDict):
    type: Literal["ids"]
    queueItemIds: list[str]


class QueuedItemPageSelectionJSON(TypedDict):
    type: Literal["page"]
    page: PageRequestJSON
    order: NotRequired[Order | None]
    runId: NotRequired[str | None]


QueuedItemSelectionJSON: TypeAlias = QueuedItemIdsSelectionJSON | QueuedItemPageSelectionJSON


class ReadIncludeJSON(TypedDict, total=False):
    messages: MessageSelectionJSON | None
    runs: RunSelectionJSON | None
    queuedItems: QueuedItemSelectionJSON | None


class ReadThreadJSON(TypedDict):
    """The JSON form of :class:`~pai_storage.ReadThreadInput`."""

    scopeKey: str
    threadId: str
    include: NotRequired[ReadIncludeJSON | None]


class ListThreadsJSON(TypedDict):
    """The JSON form of :class:`~pai_storage.ListThreadsInput`."""

    scopeKey: str
    limit: int
    agent: NotRequired[str | None]
    parentThreadId: NotRequired[str | None]
    category: NotRequired[str | None]
    includeHidden: NotRequired[bool | None]
    pageToken: NotRequired[str | None]


# ---------------------------------------------------------------- records written by a commit


class TextPartJSON(TypedDict):
    type: Literal["text"]
    text: str
    providerMetadata: NotRequired[dict[str, Any] | None]


class ReasoningPartJSON(TypedDict):
    type: Literal["reasoning"]
    text: str
    providerMetadata: NotRequired[dict[str, Any] | None]


class FilePartJSON(TypedDict):
    type: Literal["file"]
    mediaType: str
    url: str
    filename: NotRequired[str | None]
    providerMetadata: NotRequired[dict[str, Any] | None]


class ToolCallPartJSON(TypedDict):
    type: Literal["tool-call"]
    toolCallId: str
    toolName: str
    input: Any
    state: Literal["input-streaming", "input-available", "output-available", "output-error"]
    output: NotRequired[Any]
    errorText: NotRequired[str | None]
    callProviderMetadata: NotRequired[dict[str, Any] | None]
    resultProviderMetadata: NotRequired[dict[str, Any] | None]


class DataPartJSON(TypedDict):
    type: Literal["data"]
    name: str
    data: Any


PartJSON: TypeAlias = (
    TextPartJSON | ReasoningPartJSON | FilePartJSON | ToolCallPartJSON | DataPartJSON
)


class ProducerJSON(TypedDict):
    kind: Literal["user", "agent", "system", "application"]
    id: NotRequired[str | None]


class StandaloneAssociationJSON(TypedDict):
    kind: Literal["standalone"]


class RunAssociationJSON(TypedDict):
    kind: Literal["run"]
    runId: str
    relation: Literal["input", "context", "output"]


class VisibilityJSON(TypedDict):
    transcript: bool
    context: bool


class MessageDraftJSON(TypedDict):
    """A message as a commit inserts or replaces it."""

    messageId: str
    role: Literal["user", "assistant", "system", "tool"]
    parts: list[PartJSON]
    producer: ProducerJSON
    association: StandaloneAssociationJSON | RunAssociationJSON
    visibility: VisibilityJSON
    status: Literal["complete", "streaming", "incomplete", "error"]
    metadata: dict[str, Any]


class RunInitiatorJSON(TypedDict):
    kind: Literal["user", "agent", "system", "trigger"]
    id: NotRequired[str | None]


class AdmissionDraftJSON(TypedDict):
    admitted: bool
    queueItemId: NotRequired[str | None]


class RunErrorJSON(TypedDict):
    code: str
    message: str


class RunDraftJSON(TypedDict):
    """A run as a commit inserts or replaces it."""

    runId: str
    status: RunStatus
    initiator: RunInitiatorJSON
    inputMessageIds: list[str]
    admission: AdmissionDraftJSON
    metadata: dict[str, Any]
    privateMetadata: dict[str, Any]
    operation: NotRequired[Operation | None]
    error: NotRequired[RunErrorJSON | None]


class QueuedItemDraftJSON(TypedDict):
    """A queued item as a commit inserts or replaces it."""

    queueItemId: str
    runId: str
    input: Any
    metadata: dict[str, Any]


# ---------------------------------------------------------------- commits


class CreateRootJSON(TypedDict):
    agent: str
    directExecutionAllowed: bool
    listVisibility: Literal["visible", "hidden"]
    metadata: dict[str, Any]
    privateMetadata: dict[str, Any]
    parentThreadId: NotRequired[str | None]
    category: NotRequired[str | None]
    title: NotRequired[str | None]


class UpdateRootJSON(TypedDict):
    listVisibility: Literal["visible", "hidden"]
    metadata: dict[str, Any]
    privateMetadata: dict[str, Any]
    category: NotRequired[str | None]
    title: NotRequired[str | None]


class MessageInsertJSON(TypedDict):
    type: Literal["insert", "replace"]
    record: MessageDraftJSON


class RunInsertJSON(TypedDict):
    type: Literal["insert", "replace"]
    record: RunDraftJSON


class QueuedItemInsertJSON(TypedDict):
    type: Literal["insert", "replace"]
    record: QueuedItemDraftJSON


class DeleteChangeJSON(TypedDict):
    type: Literal["delete"]
    id: str


class TruncateChangeJSON(TypedDict):
    type: Literal["truncate"]
    afterId: str | None


MessageChangeJSON: TypeAlias = MessageInsertJSON | DeleteChangeJSON | TruncateChangeJSON
RunChangeJSON: TypeAlias = RunInsertJSON | DeleteChangeJSON
QueuedItemChangeJSON: TypeAlias = QueuedItemInsertJSON | DeleteChangeJSON


class LeaseRefJSON(TypedDict):
    kind: Literal["run"]
    runId: str


class AcquireLeaseJSON(TypedDict):
    type: Literal["acquire"]
    lease: LeaseRefJSON
    leaseOwnerId: str
    durationMs: int
    operation: Operation


class RenewLeaseJSON(TypedDict):
    type: Literal["renew"]
    lease: LeaseRefJSON
    leaseOwnerId: str
    durationMs: int


class ReleaseLeaseJSON(TypedDict):
    type: Literal["release"]
    lease: LeaseRefJSON
    leaseOwnerId: str
    expiry: Literal["unexpired", "any"]


class ThreadChangesJSON(TypedDict, total=False):
    messages: list[MessageChangeJSON] | None
    runs: list[RunChangeJSON] | None
    queuedItems: list[QueuedItemChangeJSON] | None
    lease: AcquireLeaseJSON | RenewLeaseJSON | ReleaseLeaseJSON | None


class MissingConditionJSON(TypedDict):
    type: Literal["missing"]


class VersionConditionJSON(TypedDict):
    type: Literal["version"]
    version: ThreadVersionJSON


class CreateMutationJSON(TypedDict):
    type: Literal["create"]
    root: CreateRootJSON
    changes: NotRequired[ThreadChangesJSON | None]


class UpdateMutationJSON(TypedDict):
    type: Literal["update"]
    root: UpdateRootJSON
    changes: NotRequired[ThreadChangesJSON | None]


class DeleteMutationJSON(TypedDict):
    type: Literal["delete"]


class CommitThreadJSON(TypedDict):
    """The JSON form of :class:`~pai_storage.CommitThreadInput`."""

    scopeKey: str
    threadId: str
    condition: MissingConditionJSON | VersionConditionJSON
    mutation: CreateMutationJSON | UpdateMutationJSON | DeleteMutationJSON
