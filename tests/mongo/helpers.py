"""Helpers of the MongoDB backend tests: raw collections and URLs through a fault proxy."""

from __future__ import annotations

from typing import Any

from pai_storage_mongo.store import MongoThreadStore


def raw_collections(store: MongoThreadStore) -> dict[str, Any]:
    """The store's four collections, decoded with PyMongo's default codec (raw BSON types)."""
    names = store.collection_names()
    return {family: store.database.client[store.db_name][name] for family, name in names.items()}


def proxied_url(port: int, **options: str) -> str:
    """A direct-connection URL to the mongod behind a loopback proxy on ``port``."""
    query = "&".join(f"{k}={v}" for k, v in {"directConnection": "true", **options}.items())
    return f"mongodb://127.0.0.1:{port}/?{query}"
