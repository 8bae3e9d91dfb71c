"""The throwaway PostgreSQL clusters of the failover tests leave nothing behind."""

from __future__ import annotations

import pytest

from failover.pg_cluster import Cluster, pg_version


def test_a_dropped_cluster_leaves_no_configuration_behind() -> None:
    try:
        version = pg_version()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    cluster = Cluster(version, "pai_failover_cleanup_check")
    try:
        cluster.create({"listen_addresses": "'127.0.0.1'"})
        assert (cluster.conf_dir / "conf.d" / "failover.conf").is_file()
    finally:
        cluster.drop()
    assert not cluster.conf_dir.exists(), sorted(map(str, cluster.conf_dir.rglob("*")))
    assert not cluster.data_dir.exists()
    cluster.drop()  # idempotent
