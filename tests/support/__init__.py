"""Test helpers shared by integration tests."""
