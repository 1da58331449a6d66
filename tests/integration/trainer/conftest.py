from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: on a shared 2-core machine OpenMP threads that spin-wait for descheduled
    peers make tiny-model steps several times slower (measured 3.5x), and results do not depend on it."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
