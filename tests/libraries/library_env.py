"""Real-library tests: transformers and timm models built from configs (no weights), the
training-framework callbacks on transformers' Trainer and Lightning, and the checkpoint
implementations of DeepSpeed, fairscale and Megatron-core on CPU.

These need torch 2.14.1 with torchvision 0.29.1 (timm imports torchvision, and PyPI's
torchvision does not import beside the project's torch 2.13.0 CPU wheel), so they run
in their own environment.  Without the libraries they skip with the reason; with
``RECHECK_REQUIRE_LIBRARIES=1`` (set in CI) a missing library is an error instead, so
CI can never skip them silently.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from types import ModuleType
from typing import Iterator

import pytest

REQUIRED = os.environ.get("RECHECK_REQUIRE_LIBRARIES") == "1"


def require(name: str) -> ModuleType:
    """Import ``name``; skip the module without it, or fail when the libraries are required."""
    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - torchvision raises RuntimeError, not ImportError
        message = (f"{name} cannot be imported ({type(exc).__name__}: {exc}); the real-library tests "
                   "need torch==2.14.1, torchvision==0.29.1, transformers, accelerate, timm, lightning, "
                   "deepspeed, fairscale and megatron-core")
        if REQUIRED:
            pytest.fail(f"RECHECK_REQUIRE_LIBRARIES=1: {message}", pytrace=False)
        pytest.skip(message, allow_module_level=True)


@contextlib.contextmanager
def logged(name: str) -> Iterator[list[logging.LogRecord]]:
    """The records the logger ``name`` handles at INFO and above while the block runs; the
    logger's handlers and level are as before after it."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(name)
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
