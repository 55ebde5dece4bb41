"""The end-to-end tier: its cluster fixtures live in tests/sandbox.py (shared with
tests/adversarial)."""
