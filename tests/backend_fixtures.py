"""Fixtures shared by tests/test_backends.py and tests/test_deepspeed.py (imported by name)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.tiny import save_tiny


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny model gains nothing from intra-op threads, and on a busy 2-core machine
    OpenMP threads contending with other processes make each matmul ~100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny"))
