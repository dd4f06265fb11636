"""DDP through torchrun: where this process sits in the job, the device of each rank, joining the process
group, averaging the loss over ranks, and wrapping the model the training step calls."""

from __future__ import annotations

import dataclasses
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..utils import resolve_device


@dataclasses.dataclass
class DistributedContext:
    """Where this process sits in a torchrun job (rank 0 of 1 when not launched by torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    created_group: bool = False

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def ddp_device(device: str | torch.device, local_rank: int, local_world_size: int) -> tuple[torch.device, str | None]:
    """The device of one DDP rank, and a line saying why CUDA was passed over (None when it was not).

    CUDA only when every process on this machine has a GPU of its own (`LOCAL_WORLD_SIZE` <= the GPUs it sees):
    the choice then agrees on every rank (one rank on CUDA and another on the CPU cannot share a process group),
    and rank r never asks for a GPU that is not there. Else `auto` trains on the CPU with gloo, and an explicit
    `cuda` is an error naming the counts. A launcher that shows each process one GPU of its own sets
    `LOCAL_RANK=0 LOCAL_WORLD_SIZE=1` in each. MPS has no collective backend: DDP runs on CUDA or on the CPU.
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    wanted = str(device).split(":")[0]
    if wanted not in ("auto", "cuda"):
        return resolve_device(device), None
    if local_world_size <= gpus:
        return torch.device("cuda", local_rank), None
    if wanted == "cuda":
        raise ValueError(
            f"device {device!r} under DDP needs a GPU per process: {local_world_size} processes on "
            f"this machine, {gpus} GPU(s) visible; launch at most {gpus} (torchrun "
            f"--nproc_per_node={gpus}) or use device='cpu' (gloo)"
        )
    reason = None
    if gpus:
        reason = (
            f"DDP: {local_world_size} processes on this machine but {gpus} GPU(s): each rank needs its own, "
            f"so all ranks train on the CPU with gloo"
        )
    return torch.device("cpu"), reason


def setup_distributed(device: str | torch.device) -> tuple[DistributedContext, torch.device]:
    """Join the torchrun process group when `WORLD_SIZE > 1` (nccl on CUDA, gloo otherwise)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistributedContext(), resolve_device(device)
    context = DistributedContext(
        rank=int(os.environ["RANK"]), world_size=world_size, local_rank=int(os.environ.get("LOCAL_RANK", "0"))
    )
    # a launcher that does not say how many processes share this machine: assume all of them (the safe side)
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    device, reason = ddp_device(device, context.local_rank, local_world_size)
    if reason and context.is_main:
        print(reason, file=sys.stderr)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        context.created_group = True
    return context, device


def mean_over_ranks(loss, context: DistributedContext) -> float:
    loss = loss.detach().float()
    if context.enabled:  # SUM then divide: gloo has no AVG
        dist.all_reduce(loss, op=dist.ReduceOp.SUM)
        loss /= context.world_size
    return loss.item()


def wrap(model: nn.Module, context: DistributedContext, device: torch.device, compile: bool) -> nn.Module:
    """The module a training step calls: the model, in DDP when launched by torchrun, compiled on request."""
    if context.enabled:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return torch.compile(model) if compile else model
