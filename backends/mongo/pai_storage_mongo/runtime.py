"""What the four MongoDB runtime stores share: their client holder and their collection.

:class:`MongoRuntimeStore` is the base of the key-value store, the agent-state
store, the snapshot store and the execution guard. It comes first among a
store's bases, before the store's contract class (``KeyValueStore``,
``AgentStateStore``, ``SnapshotStore``, ``ExecutionGuard``), and names the
store's ``component`` (``kv``, ``state``, ``snapshots``, ``guard``). Its
constructor is every store's: it passes the contract's options to the
contract class, then takes the client holder with the URL, the client and
the holder's options (:func:`split_client_options` tells them apart), so a
store refused for a bad option holds no client. A store then only

- says which indexes its collection has (:meth:`~MongoRuntimeStore._indexes`)
  and, when one is a TTL index that follows an option, its name and the
  option's (:attr:`~MongoRuntimeStore.ttl_index`,
  :attr:`~MongoRuntimeStore.ttl_option`): ``initialize()`` then refuses a
  collection whose index expires documents after another time
  (:meth:`~MongoRuntimeStore._verify`).

The holder (:class:`~pai_storage_mongo.client.MongoClientHolder`) is taken in
the constructor and released by ``close()``; the collection is opened by
``initialize()``. See ``docs/mongodb.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from pai_storage.backend import StoreURL
from pai_storage.errors import ConfigurationError
from pai_storage.runtime import RuntimeStore

from .client import CLIENT_OPTIONS, Doc, MongoClientHolder, plain

if TYPE_CHECKING:
    from pymongo import IndexModel
    from pymongo.asynchronous.collection import AsyncCollection

__all__ = ["MongoRuntimeStore", "split_client_options"]


def split_client_options(options: dict[str, Any]) -> dict[str, Any]:
    """Remove and return the client holder's options among a store's keyword arguments."""
    return {k: options.pop(k) for k in list(options) if k in CLIENT_OPTIONS}


class MongoRuntimeStore(RuntimeStore):
    """A MongoDB runtime store: one collection on a :class:`MongoClientHolder`'s client.

    Put it before the store's contract class among its bases, so that its
    constructor, ``_initialize`` and ``_close`` are the store's.

    Parameters
    ----------
    url:
        The ``mongodb://`` or ``mongodb+srv://`` URL (not needed with ``client=``).
    client:
        An application's own ``AsyncMongoClient`` (never closed by
        pai-storage), or the :class:`MongoClientHolder` shared by the stores of
        one ``connect()`` call.
    **options:
        Where the collection lives (``db_name``, ``collection_prefix``,
        ``names``: the holder's options, see :mod:`pai_storage_mongo.client`;
        not with a shared holder), and the options of the store's contract
        class (``clock``, ``on_warning``, ``token_secret``, and its own).
    """

    backend_name = "mongo"
    token_prefix = "pai-mongo"
    component: ClassVar[str]
    """The store's component: its collection's key in the holder's names."""
    ttl_index: ClassVar[str | None] = None
    """The name of the store's TTL index whose ``expireAfterSeconds`` follows
    :attr:`ttl_option` (``None``: no such index)."""
    ttl_option: ClassVar[str] = ""
    """The option the TTL index follows (``session_ttl``, ``snapshot_ttl``)."""

    url: StoreURL
    """The URL of the store's client (the password masked when shown)."""
    collection_name: str
    """The name of the store's collection."""
    _holder: MongoClientHolder
    _col: AsyncCollection[Doc] | None
    _modify_col: AsyncCollection[Doc] | None

    def __init__(
        self, url: str | StoreURL | None = None, *, client: object = None, **options: Any
    ) -> None:
        holder_options = split_client_options(options)
        # The contract's options first: a store refused for a bad one holds no client.
        super().__init__(**options)
        self._holder = MongoClientHolder.attached(url, client, **holder_options)
        self.url = self._holder.url
        self.collection_name = self._holder.name(self.component)
        self._col = None
        self._modify_col = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url.render()!r}, collection={self.collection_name!r})"

    @property
    def collection(self) -> AsyncCollection[Doc]:
        """The store's PyMongo collection (for operators and tests; initialize first)."""
        if self._col is None:
            raise self._unopened_error()
        return self._col

    @property
    def _modify(self) -> AsyncCollection[Doc]:
        """The collection for ``findAndModify`` (see :func:`.client.plain`)."""
        if self._modify_col is None:
            raise self._unopened_error()
        return self._modify_col

    def _unopened_error(self) -> ConfigurationError:
        """What :attr:`collection` raises before ``initialize()`` and after ``close()``."""
        return self._closed_error()

    def _indexes(self) -> Sequence[IndexModel]:
        """The indexes of the store's collection (created once per collection per client)."""
        return ()

    async def _verify(self, collection: AsyncCollection[Doc]) -> None:
        """Check the collection once its indexes exist: its :attr:`ttl_index`.

        MongoDB keeps an existing index's ``expireAfterSeconds`` when
        ``createIndexes`` asks for the same index with another one, so a store
        opened with a longer TTL than the index's would have documents it
        still holds live deleted by the server (or, the other way, expired
        ones kept): refused.

        Raises
        ------
        ConfigurationError
            The index expires documents after another time than the option
            (or exists while the option says nothing expires, or is missing).
        """
        if self.ttl_index is None:
            return
        expected = next(
            (
                m.document.get("expireAfterSeconds")
                for m in self._indexes()
                if m.document["name"] == self.ttl_index
            ),
            None,
        )
        with self._holder.errors("connect"):
            found = await collection.index_information()
        actual = found.get(self.ttl_index, {}).get("expireAfterSeconds")
        if actual != expected:
            raise ConfigurationError(
                f"collection {collection.name!r}: its TTL index {self.ttl_index} says "
                f"{_expiry(actual)} but this store's {self.ttl_option} says {_expiry(expected)}; "
                f"drop that index, use the same {self.ttl_option}, or choose another "
                "collection name (option names or collection_prefix)"
            )

    async def _initialize(self) -> None:
        collection = await self._holder.collection(self.component, self._indexes())
        await self._verify(collection)
        self._col = collection
        self._modify_col = plain(collection)

    async def _close(self) -> None:
        self._col = self._modify_col = None
        await self._holder.release()

    def _now(self) -> datetime | str:
        """The store's clock as an aggregation expression: the test clock, else ``$$NOW``."""
        now = self.now()
        return "$$NOW" if now is None else now


def _expiry(seconds: object) -> str:
    return "no expiry" if seconds is None else f"{seconds} s"
