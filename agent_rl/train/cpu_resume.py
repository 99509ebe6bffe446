"""Resuming a multi-process CPU stage from its checkpoint.

transformers (5.17) loads the optimizer state of a multi-process run onto `args.device` (on GPUs, each process's
own card). Processes on CPUs (accelerate launch, gloo) get a device such as 'cpu:0', which `torch.load` refuses as a
location, so a preempted two-process CPU stage could save checkpoints but never resume from one. On CPUs every
process's state belongs in its own memory: it is loaded there.
"""

from __future__ import annotations

import os

OPTIMIZER_FILE = "optimizer.pt"  # transformers' names inside a checkpoint
SCHEDULER_FILE = "scheduler.pt"


class CpuResumeMixin:
    """Put before the Trainer class in the bases; overrides `Trainer._load_optimizer_and_scheduler` only where the
    stock method fails (several CPU processes, a checkpoint with both states), so GPU runs take the stock path."""

    def _load_optimizer_and_scheduler(self, checkpoint):
        import torch

        device = self.args.device
        if (not checkpoint or self.args.world_size <= 1 or device.type != "cpu" or device.index is None
                or self.is_fsdp_enabled or self.is_deepspeed_enabled):
            return super()._load_optimizer_and_scheduler(checkpoint)
        optimizer, scheduler = os.path.join(checkpoint, OPTIMIZER_FILE), os.path.join(checkpoint, SCHEDULER_FILE)
        if not (os.path.isfile(optimizer) and os.path.isfile(scheduler)):
            return super()._load_optimizer_and_scheduler(checkpoint)  # its own checks and messages
        self.optimizer.load_state_dict(torch.load(optimizer, map_location="cpu", weights_only=True))
        self.lr_scheduler.load_state_dict(torch.load(scheduler, map_location="cpu", weights_only=True))
        return None
