"""Helpers, constants and fixture plugins shared by test modules: a test module imports from here, never from another
test module or a tier's conftest (tests/unit/test_test_layout.py)."""
