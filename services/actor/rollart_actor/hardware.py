"""What the actor declares of its hardware to the resource manager and the ledger."""

from __future__ import annotations

import contextlib
import os

from rollart.v1 import common_pb2

from .config import ActorConfig


def detect_hardware(cfg: ActorConfig, device: str) -> common_pb2.Hardware:
    hw = cfg.hardware
    accelerator, count, mem = hw.accelerator, hw.count, hw.memory_gib
    if device == "cuda":
        with contextlib.suppress(Exception):
            import torch

            props = torch.cuda.get_device_properties(0)
            accelerator = accelerator or props.name
            count = count or torch.cuda.device_count()
            mem = mem or props.total_memory / 2**30
    accelerator = accelerator or "cpu"
    count = count or (os.cpu_count() or 1)
    if not mem:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    tags = list(hw.tags)
    # A pool_kind set on purpose is declared to the resource manager, which refuses it in a pool of another
    # kind (the default "cpu" is not: an actor joining an existing pool takes that pool's kind).
    kind_tag = f"kind:{cfg.pool_kind}"
    if "pool_kind" in cfg.model_fields_set and kind_tag not in tags:
        tags.append(kind_tag)
    return common_pb2.Hardware(accelerator=accelerator, count=int(count), memory_gib=round(float(mem), 2), tags=tags)
