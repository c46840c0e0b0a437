import sys
from pathlib import Path

import pytest

# bad_cases.py is shared with netns-tests/; make it importable from both.
sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config):
    """Validated models and rendered files go to this run's own cache, not
    the machine user's (~/.cache/lbctl): for these tests and every lbctl
    they start."""
    import os
    import tempfile

    # In the home folder: lbctl trusts no cache under /tmp (see lbctl/trust.py).
    config.lbctl_cache = tempfile.mkdtemp(prefix=".lbctl-test-cache-",
                                          dir=os.path.expanduser("~"))
    os.environ["XDG_CACHE_HOME"] = config.lbctl_cache


def pytest_unconfigure(config):
    import shutil

    shutil.rmtree(getattr(config, "lbctl_cache", ""), ignore_errors=True)


@pytest.fixture
def own_cache(monkeypatch):
    """An empty cache for one test, in the run's own (lbctl trusts none under
    /tmp); returns its lbctl folder."""
    import os
    import tempfile

    base = tempfile.mkdtemp(dir=os.environ["XDG_CACHE_HOME"])
    monkeypatch.setenv("XDG_CACHE_HOME", base)
    return Path(base) / "lbctl"
