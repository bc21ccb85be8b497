"""Shared pytest set-up: the tests see the scripts' own defaults, whatever the developer's shell exports."""
import pytest

import results
@pytest.fixture(autouse=True)
def no_handout_from_the_shell(monkeypatch):
    """CS336_HANDOUT picks the default handout; a test that wants it sets it (child processes inherit this)."""
    monkeypatch.delenv(results.HANDOUT_ENV, raising=False)
