"""Data-parallel runs under ``torchrun``: the process group (gloo on CPU, nccl on CUDA),
this process's rank and device."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

__all__ = ["default_device", "init_process_group", "rank_world"]


def rank_world() -> tuple[int, int]:
    """``(rank, world_size)`` of this process (``(0, 1)`` outside a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def default_device(device: str | None, local_rank: int) -> torch.device:
    """``device`` if given, else this rank's GPU when CUDA is available, else the CPU."""
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_process_group(device_name: str | None) -> tuple[torch.device, bool]:
    """This process's device, and whether a process group was created here (under
    ``torchrun``, ``WORLD_SIZE > 1``, and none exists yet); the caller destroys what it made."""
    world_env = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = default_device(device_name, local_rank)
    if world_env > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        return device, True
    return device, False
