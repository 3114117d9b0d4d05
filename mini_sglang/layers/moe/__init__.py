"""Mixture-of-experts: the router, the fused expert computation (a Triton kernel on the GPU,
plain torch on the CPU as the reference) and the FusedMoE layer that holds every expert's
weights stacked, split over the TP group by intermediate dimension and/or whole experts."""

from __future__ import annotations
