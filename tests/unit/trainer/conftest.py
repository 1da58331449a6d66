"""A real tiny Qwen3 (2 layers, hidden 128, vocab 512) built once per session for the trainer's unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

SMALL = {"layers": 2, "hidden": 128, "vocab_size": 512}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from rollart_devtools.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("trainer-model") / "tiny"
    build_tiny_model(out, seed=0, pretrain_steps=0, **SMALL)
    return out


@pytest.fixture(scope="session")
def tiny_tied_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    from rollart_devtools.tiny_model import build_tiny_model

    out = tmp_path_factory.mktemp("trainer-model-tied") / "tiny"
    build_tiny_model(out, seed=1, pretrain_steps=0, tie_embeddings=True, **SMALL)
    return out


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: on a shared 2-core machine OpenMP threads that spin-wait for descheduled
    peers make tiny-model steps several times slower, and results do not depend on it."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
