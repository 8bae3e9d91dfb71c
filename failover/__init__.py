"""Failover tests: real replica sets and standbys, faults under load (run on their own)."""
