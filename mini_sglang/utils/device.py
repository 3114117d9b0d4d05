"""Host->device copies that never stall the host.

A non_blocking copy from pageable host memory still waits for the device to drain the work
queued before it (the driver stages pageable memory synchronously). With overlap scheduling
that wait would serialise the CPU with the GPU, so every copy on the step path goes through
pinned memory.
"""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` on `device`, copied asynchronously through pinned memory when it is a GPU."""
    device = torch.device(device)
    if device.type == "cpu" or t.device == device:
        return t.to(device)
    if t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)
