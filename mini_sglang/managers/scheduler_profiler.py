"""SchedulerProfiler: the scheduler's component for /start_profile, /stop_profile (SGLang
0.5.4's SchedulerProfilerMixin) and /slow_down, the other tool for studying the server under
load. It owns the forward-step counter (`forward_ct`, also read by the watchdog) and every
profiler setting; the scheduler calls `on_step(batch)` before each forward and routes
ProfileReq / SlowDownReqInput to `profile` / `slow_down` (see `dispatch`).

Every TP rank gets the same ProfileReq (rank 0 broadcasts what it receives) and runs its own
torch.profiler; only rank 0's reply reaches the TokenizerManager. Contract:

- START without ``start_step`` / ``profile_by_stage`` starts at once; with them, the trace
  starts at forward step ``start_step`` or at the first prefill batch. ``num_steps`` stops
  it by itself: ``forward_ct`` (incremented before each forward) reaching start + num_steps
  stops the trace before that step runs, as SGLang does. By stage, a prefill trace then a
  decode trace of ``num_steps`` batches each (suffix ``-EXTEND`` / ``-DECODE``).
- A trace is ``{output_dir}/{profile_id}-TP-{tp}[-DP-{dp}][-STAGE].trace.json.gz``; the
  directory defaults to $SGLANG_TORCH_PROFILER_DIR or /tmp and is created at stop.
- Errors are replies with success=False: a START while a trace runs, a STOP without one.
- Activities: "CPU", "GPU" (CUDA), "MEM" (CUDA memory snapshot, a pickle) and
  "CUDA_PROFILER" (cudaProfilerStart/Stop, for nsys). Without CUDA the CUDA ones are
  dropped with a warning; if nothing is left the START fails.
- /slow_down {"forward_sleep_time": s}: every rank sleeps s seconds before each forward
  until a request with null (or s <= 0) ends it; SGLang uses it to let a decode instance
  fill up before it runs at full speed.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

from mini_sglang.distributed.parallel_state import get_tp_group
from mini_sglang.environ import envs
from mini_sglang.managers.io_struct.control import (
    ProfileReq,
    ProfileReqOutput,
    ProfileReqType,
    SlowDownReqInput,
    SlowDownReqOutput,
)
from mini_sglang.model_executor.forward_batch_info import ForwardMode
from mini_sglang.utils.profile_merger import merge_chrome_traces

logger = logging.getLogger("mini_sglang")

CUDA_ACTIVITIES = ("GPU", "MEM", "CUDA_PROFILER")
KNOWN_ACTIVITIES = ("CPU", *CUDA_ACTIVITIES)


class SchedulerProfiler:
    def __init__(self, tp_rank: int, tp_size: int, dp_size: int, dp_rank: int | None) -> None:
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.dp_size, self.dp_rank = dp_size, dp_rank or 0
        self.forward_ct = 0
        self.forward_sleep_time: Optional[float] = None
        self.torch_profiler: Optional[torch.profiler.profile] = None
        self.profile_in_progress = False
        self.profile_id: Optional[str] = None
        self.profiler_output_dir: Optional[str] = None
        self.profiler_activities: list[str] = []
        self.profiler_with_stack = True
        self.profiler_record_shapes = False
        self.profiler_merge = False
        self.profile_by_stage = False
        self.profiler_start_forward_ct: Optional[int] = None
        self.profiler_target_forward_ct: Optional[int] = None
        # By stage: batches of each stage seen so far, how many to trace (None: until the
        # other stage begins, or /stop_profile), and the stage being traced now.
        self.profiler_stage_ct: dict[str, int] = {}
        self.profiler_stage_target: Optional[int] = None
        self.profiler_stage: Optional[ForwardMode] = None

    def dispatch(self) -> dict[type, Callable[[Any], Any]]:
        """Entries for the scheduler's type -> handler table."""
        return {ProfileReq: self.profile, SlowDownReqInput: self.slow_down}

    def slow_down(self, recv: SlowDownReqInput) -> SlowDownReqOutput:
        t = recv.forward_sleep_time
        self.forward_sleep_time = t if t is not None and t > 0 else None
        return SlowDownReqOutput()

    # ---- requests ------------------------------------------------------------------------
    def profile(self, recv: ProfileReq) -> ProfileReqOutput:
        if recv.type == ProfileReqType.STOP_PROFILE:
            # Unlike SGLang, a STOP also cancels a start that is still pending.
            self.profile_by_stage = False
            self.profiler_start_forward_ct = None
            return self.stop_profile()
        out = self.init_profile(recv)
        if not out.success or recv.profile_by_stage or recv.start_step:
            return out  # the trace starts later, in on_step
        return self.start_profile()

    def init_profile(self, recv: ProfileReq) -> ProfileReqOutput:
        """Record the settings; start nothing yet."""
        if self.profile_in_progress:
            return ProfileReqOutput(
                success=False,
                message="Profiling is already in progress. Call /stop_profile first.",
            )
        activities = list(recv.activities) if recv.activities is not None else ["CPU", "GPU"]
        unknown = [a for a in activities if a not in KNOWN_ACTIVITIES]
        if unknown:
            logger.warning("Profiler: unsupported activities %s are ignored.", unknown)
        if not torch.cuda.is_available():
            dropped = [a for a in activities if a in CUDA_ACTIVITIES]
            if dropped and recv.activities is not None:
                logger.warning("Profiler: CUDA is not available; ignoring %s.", dropped)
            activities = [a for a in activities if a not in CUDA_ACTIVITIES]
        activities = [a for a in activities if a in KNOWN_ACTIVITIES]
        if not activities:
            return ProfileReqOutput(
                success=False,
                message=f"No supported profiler activity in {recv.activities}.",
            )
        self.profiler_activities = activities
        self.profiler_output_dir = recv.output_dir or envs.SGLANG_TORCH_PROFILER_DIR.get()
        self.profile_id = recv.profile_id or str(time.time())
        self.profiler_with_stack = recv.with_stack is not False
        self.profiler_record_shapes = bool(recv.record_shapes)
        self.profiler_merge = recv.merge_profiles
        self.profile_by_stage = recv.profile_by_stage
        self.profiler_stage_ct = {}
        self.profiler_stage_target = recv.num_steps or None
        self.profiler_start_forward_ct = None
        self.profiler_target_forward_ct = None
        if recv.start_step:
            # A step already run cannot be traced: start at the next one at the earliest.
            self.profiler_start_forward_ct = max(recv.start_step, self.forward_ct + 1)
        if recv.num_steps and not recv.profile_by_stage:
            begin = self.profiler_start_forward_ct or self.forward_ct
            self.profiler_target_forward_ct = begin + recv.num_steps
        return ProfileReqOutput(success=True, message="Succeeded")

    def start_profile(self, stage: Optional[ForwardMode] = None) -> ProfileReqOutput:
        stage_str = f" for {stage.name}" if stage is not None else ""
        logger.info(
            "Profiling starts%s. Traces will be saved to: %s (with profile id: %s)",
            stage_str,
            self.profiler_output_dir,
            self.profile_id,
        )
        acts = self.profiler_activities
        kinds = [torch.profiler.ProfilerActivity.CPU] if "CPU" in acts else []
        if "GPU" in acts:
            kinds.append(torch.profiler.ProfilerActivity.CUDA)
        if kinds:
            self.torch_profiler = torch.profiler.profile(
                activities=kinds,
                with_stack=self.profiler_with_stack,
                record_shapes=self.profiler_record_shapes,
            )
            self.torch_profiler.start()
        if "MEM" in acts:
            torch.cuda.memory._record_memory_history(max_entries=100000)
        if "CUDA_PROFILER" in acts:
            torch.cuda.cudart().cudaProfilerStart()
        self.profile_in_progress = True
        return ProfileReqOutput(success=True, message="Succeeded")

    def stop_profile(self, stage: Optional[ForwardMode] = None) -> ProfileReqOutput:
        if not self.profile_in_progress:
            return ProfileReqOutput(
                success=False,
                message="Profiling is not in progress. Call /start_profile first.",
            )
        out_dir = self.profiler_output_dir or "/tmp"
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        suffix = f"-{stage.name}" if stage is not None else ""
        logger.info("Stop profiling%s...", suffix)
        if self.torch_profiler is not None:
            self.torch_profiler.stop()
            self.torch_profiler.export_chrome_trace(
                os.path.join(out_dir, self._trace_name(suffix) + ".trace.json.gz")
            )
            self.torch_profiler = None
        if "MEM" in self.profiler_activities:
            name = f"{time.time()}-TP-{self.tp_rank}-memory{suffix}.pickle"
            torch.cuda.memory._dump_snapshot(os.path.join(out_dir, name))
            torch.cuda.memory._record_memory_history(enabled=None)
        if "CUDA_PROFILER" in self.profiler_activities:
            torch.cuda.cudart().cudaProfilerStop()
        self._tp_barrier()  # every rank's trace is on disk before rank 0 answers
        merged = self._merge_traces(out_dir)
        logger.info("Profiling done. Traces are saved to: %s%s", out_dir, merged)
        self.profile_in_progress = False
        self.profiler_stage = None
        # Unlike SGLang, forget the targets: a finished auto-stop must not fire again.
        self.profiler_start_forward_ct = None
        self.profiler_target_forward_ct = None
        return ProfileReqOutput(success=True, message=f"Succeeded.{merged}")

    # ---- per-step hook -------------------------------------------------------------------
    def on_step(self, batch: Any) -> None:
        """Called before every forward: count it, sleep if slowed down, and start / stop a
        pending trace."""
        self.forward_ct += 1
        if self.forward_sleep_time is not None:
            logger.info("Scheduler.run_batch sleep %ss", self.forward_sleep_time)
            time.sleep(self.forward_sleep_time)
        if self.profile_by_stage:
            self._profile_stage_step(batch.forward_mode)
            return
        target = self.profiler_target_forward_ct
        if target is not None and target <= self.forward_ct and self.profile_in_progress:
            self.stop_profile()
        if self.profiler_start_forward_ct == self.forward_ct:
            self.start_profile()

    def _profile_stage_step(self, mode: ForwardMode) -> None:
        if mode.is_idle():
            return
        stage = ForwardMode.EXTEND if mode.is_extend() else ForwardMode.DECODE
        seen = self.profiler_stage_ct.get(stage.name, 0)
        if seen == 0:
            if self.profiler_stage is not None:  # the other stage's trace ends here
                self.stop_profile(stage=self.profiler_stage)
            self.start_profile(stage)
            self.profiler_stage = stage
        self.profiler_stage_ct[stage.name] = seen + 1
        target = self.profiler_stage_target
        # Checked before the step runs, so exactly `target` batches of the stage are traced.
        if target is not None and seen + 1 > target and self.profiler_stage == stage:
            self.stop_profile(stage=stage)
        if len(self.profiler_stage_ct) == 2 and self.profiler_stage is None:
            self.profile_by_stage = False  # both stages traced

    # ---- helpers -------------------------------------------------------------------------
    def _trace_name(self, suffix: str) -> str:
        parts = [str(self.profile_id), f"TP-{self.tp_rank}"]
        if self.dp_size > 1:
            parts.append(f"DP-{self.dp_rank}")
        return "-".join(parts) + suffix

    def _tp_barrier(self) -> None:
        if self.tp_size <= 1:
            return
        dist.barrier(group=get_tp_group().cpu_group)

    def _merge_traces(self, out_dir: str) -> str:
        """With merge_profiles, rank 0 of replica 0 merges every rank's trace into one."""
        if not self.profiler_merge or self.tp_rank != 0 or self.dp_rank:
            return ""
        try:
            path, n_events, n_files = merge_chrome_traces(out_dir, str(self.profile_id))
        except Exception as e:  # a failed merge must not fail the profile itself
            logger.error("Failed to merge profiles: %s", e)
            return f" Merge failed: {e!s}"
        return f" Merged trace: {path} (Events: {n_events}, Files: {n_files})"
