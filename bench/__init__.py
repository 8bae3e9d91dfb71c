"""Benchmarks of pai-storage (not part of the installed library)."""
