"""The snapshot conformance topic on the directory store and on the S3 store (emulated)."""

from __future__ import annotations

import pytest
from pai_storage_conformance.suite.snapshots import SnapshotStoreTests
from pai_storage_objects.files import DirectorySnapshotStore

from pai_storage.snapshots import SnapshotStore


class TestDirectorySnapshotStore(SnapshotStoreTests):
    @pytest.fixture
    def snapshot_store(self, directory_store: SnapshotStore) -> SnapshotStore:
        assert isinstance(directory_store, DirectorySnapshotStore)
        return directory_store


class TestS3SnapshotStore(SnapshotStoreTests):
    @pytest.fixture
    def snapshot_store(self, s3_store: SnapshotStore) -> SnapshotStore:
        return s3_store

    @pytest.fixture
    def pai_examples(self) -> int:
        # Every step of the model-based test is several HTTP round trips to the
        # emulator: 10 examples of 40 steps each (not the default 25) keep this
        # CI step short; the directory store runs the full budget.
        return 10
