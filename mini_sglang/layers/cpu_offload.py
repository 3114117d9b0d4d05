"""--cpu-offload-gb: decoder layers whose weights live in host memory and are copied to the
device for each call (SGLang 0.5.4's OffloaderV1, srt/utils/offloader.py).

How a model uses it: it builds its decoder layer list through `offload_layers(...)`. While
the model loader holds a `cpu_offload(max_bytes, device)` context, each layer, as soon as it
is created, has its parameters moved to host memory if the running total of offloaded bytes
stays within `max_bytes`; the rest stay on the device. Outside such a context (or with a
budget of 0) `offload_layers` returns the layers untouched.

Contract of an offloaded layer:
- Its parameters keep their identity (the same `nn.Parameter` objects); between calls their
  `.data` is a host tensor, pinned when the compute device is CUDA. Weights are therefore
  loaded (and later updated from disk, tensors or a trainer) straight into host memory by
  the parameters' ordinary weight loaders, which copy in place.
- Each method named in the layer's `offload_entry_points` (default: `("forward",)`) is
  wrapped: for the call, every parameter's `.data` is a fresh device copy of its host
  tensor (`non_blocking` from pinned memory); afterwards the host tensor is put back and
  the device copies are freed to the caching allocator.
- Under CUDA graph capture the copies are recorded as host-to-device memcpy nodes reading
  the pinned host tensors, which stay where they are for the life of the model; a replay
  thus streams the current host weights, including any update made after capture. SGLang
  keeps CUDA graphs on with offloading, and so does mini-sglang.

Differences from SGLang, on purpose: layers are offloaded whole and the offloaded total
never exceeds the budget (SGLang moves parameters one at a time while its running total is
below the budget, so it may split a layer and overshoot by one parameter); the first layer
that does not fit ends offloading, so the offloaded layers are a prefix of the list (first
layers first, as SGLang). Parameters are swapped through `.data` rather than SGLang's
`torch.func.functional_call`, so methods other than `forward` (the fused decode path) and
code holding a parameter object see the device copy too.

On a CPU device there is nothing to offload: `offload_bytes_for_device` makes the budget 0
(ServerArgs warns about the flag once).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

logger = logging.getLogger("mini_sglang")

GiB = 1 << 30

_active: contextvars.ContextVar[CpuOffloader | None] = contextvars.ContextVar(
    "cpu_offloader", default=None
)


def offload_bytes_for_device(cpu_offload_gb: float, device: torch.device) -> int:
    """The offload budget in bytes for --cpu-offload-gb on `device`: 0 on CPU (the weights
    already live in host memory), else cpu_offload_gb GiB (SGLang: int(gb * 1024**3))."""
    if device.type == "cpu" or cpu_offload_gb <= 0:
        return 0
    return int(cpu_offload_gb * GiB)


def param_bytes(params: Iterable[torch.Tensor]) -> int:
    return sum(p.numel() * p.element_size() for p in params)


class _HostWeights:
    """The host copies of one module's parameters and the swap to device copies for a call."""

    def __init__(self, params: list[nn.Parameter], device: torch.device, pin: bool) -> None:
        self.params = params
        self.device = device
        self.host = [_host_copy(p.data, pin) for p in params]
        self.depth = 0  # entry points calling each other swap once
        self.restore()

    def restore(self) -> None:
        for p, host in zip(self.params, self.host):
            p.data = host

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        if self.depth:
            yield
            return
        self.depth += 1
        try:
            for p, host in zip(self.params, self.host):
                p.data = host.to(self.device, non_blocking=True, copy=True)
            yield
        finally:
            self.restore()
            self.depth -= 1

    def wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def run_with_device_weights(*args: Any, **kwargs: Any) -> Any:
            with self.on_device():
                return method(*args, **kwargs)

        return run_with_device_weights


def _host_copy(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """A host tensor with t's size, strides and values (pinned if asked: required for the
    copies to be asynchronous and capturable in a CUDA graph)."""
    host = torch.empty_strided(
        t.size(), t.stride(), dtype=t.dtype, layout=t.layout, device="cpu", pin_memory=pin
    )
    host.copy_(t)
    return host


class CpuOffloader:
    """Offloads whole modules, in the order offered, while `max_bytes` lasts.

    `device` is where the modules compute; host tensors are pinned when it is CUDA (unless
    `pin_memory` says otherwise). `offloaded_bytes` / `num_offloaded` report what was moved.
    """

    def __init__(self, max_bytes: int, device: torch.device, pin_memory: bool | None = None):
        self.max_bytes = max_bytes
        self.device = torch.device(device)
        self.pin_memory = self.device.type == "cuda" if pin_memory is None else pin_memory
        self.offloaded_bytes = 0
        self.num_offloaded = 0
        self._full = False

    def maybe_offload(self, module: nn.Module) -> nn.Module:
        """Move `module`'s parameters to host memory if all of them fit in what is left of
        the budget and no earlier module was refused; returns `module`."""
        params = list(module.parameters())
        nbytes = param_bytes(params)
        if not params or self._full:
            return module
        if self.offloaded_bytes + nbytes > self.max_bytes:
            self._full = True
            return module
        weights = _HostWeights(params, self.device, self.pin_memory)
        for name in getattr(module, "offload_entry_points", ("forward",)):
            setattr(module, name, weights.wrap(getattr(module, name)))
        self.offloaded_bytes += nbytes
        self.num_offloaded += 1
        return module


@contextlib.contextmanager
def cpu_offload(max_bytes: int, device: torch.device) -> Iterator[CpuOffloader | None]:
    """Within the block, `offload_layers` offloads into one budget of `max_bytes` (none if
    0). Yields the offloader (None for a budget of 0) for its report."""
    offloader = CpuOffloader(max_bytes, device) if max_bytes > 0 else None
    token = _active.set(offloader)
    try:
        yield offloader
    finally:
        _active.reset(token)


def offload_layers(layers: Iterable[nn.Module]) -> list[nn.Module]:
    """The layers, each offloaded as it is created while the active budget lasts (see the
    module docstring). Pass a generator so a layer leaves the device before the next one
    is allocated: the device then never holds more than one offloaded layer at a time."""
    offloader = _active.get()
    if offloader is None:
        return list(layers)
    return [offloader.maybe_offload(layer) for layer in layers]
