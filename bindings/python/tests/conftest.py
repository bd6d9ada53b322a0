"""Shared fixtures. The tests import the package from this source tree (bindings/python), and
find libwsync through $WSYNC_LIBRARY like any user would."""

import sys
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT = PACKAGE_ROOT.parents[1]
HEADER = REPO_ROOT / "include" / "wsync.h"

if str(PACKAGE_ROOT) not in sys.path:
    sys.path.insert(0, str(PACKAGE_ROOT))

import wsync  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _library_loaded():
    """Every test needs the library: fail loudly (with every place searched) if it is missing."""
    try:
        wsync.load_library()
    except wsync.LibraryError as exc:
        pytest.exit(f"libwsync not found; set WSYNC_LIBRARY. {exc}", returncode=4)


class Sync:
    """A trainer strategy with its sender and receivers (the first `attach` of `receivers`,
    default all) in this one process."""

    def __init__(self, receivers=1, buckets=2, bucket_bytes=1 << 20, attach=None, timeout_ms=5000,
                 **options):
        self.strategy = wsync.Strategy("shm", receivers=receivers, buckets=buckets,
                                       bucket_bytes=bucket_bytes, timeout_ms=timeout_ms, **options)
        self.init = self.strategy.create_init_info()
        self.sender = self.strategy.sender(self.init)
        self.engine_strategy = wsync.Strategy("shm")
        count = receivers if attach is None else attach
        self.receivers = [self.engine_strategy.receiver(self.init, i) for i in range(count)]

    @property
    def receiver(self):
        return self.receivers[0]

    def close(self):
        for r in self.receivers:
            r.close()
        self.sender.close()
        self.strategy.close()
        self.engine_strategy.close()


@pytest.fixture
def make_sync():
    """Factory of in-process syncs, all closed after the test."""
    made = []

    def make(**kwargs):
        s = Sync(**kwargs)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture
def sync(make_sync):
    """One sender and one receiver over shm with two 1 MiB buckets."""
    return make_sync()


def shm_segment(init: bytes) -> str:
    """The /dev/shm path of an shm init info's segment."""
    return "/dev/shm" + wsync.describe(init)["body"]["segment"]


def wsync_library_path() -> str:
    return wsync.load_library().path


needs_header = pytest.mark.skipif(not HEADER.exists(), reason=f"{HEADER} not present (tests run "
                                  "outside the libwsync source tree)")
