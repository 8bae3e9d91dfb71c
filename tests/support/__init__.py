"""Helpers shared by the test suites of several backends."""
