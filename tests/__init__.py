"""The test tiers. tests/support's helpers assert the way test modules do: pytest rewrites
their asserts (the values in the failure, and kept under ``python -O``). Registered here,
before any conftest imports them."""

import pytest

pytest.register_assert_rewrite("tests.support")
