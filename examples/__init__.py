"""Runnable examples of srl's plugin points (each has a YAML beside it and a test in tests/test_examples.py)."""
