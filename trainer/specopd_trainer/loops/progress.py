"""The progress bar of a training run, against the bound that actually stops it.

A run stops at ``steps`` optimiser steps or, with ``max_minutes``, when its training time (resumes included) passes
the budget, whichever comes first. A bar over steps alone showed e.g. ``68/2000 [06:03<2:52:03]`` for a 6-minute
SFT and then stopped at 68. With a time budget the bar therefore runs over seconds of training time: its total is
the projected end, min(budget, now + remaining steps x mean step time of this run), so percentage and ETA follow
whichever bound binds; the step count is in the postfix (``step=68/2000``).
"""

from __future__ import annotations

from typing import Dict, Optional, TextIO

TIME_BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]"


class TrainProgress:
    """tqdm bar of one run (``enabled=False``: no bar, every call a no-op).

    Args:
        desc: bar label. steps: the run's total step bound. start_step: steps done before this call (resume).
        max_minutes: training-time budget in minutes (None: steps only). wall_before: training seconds done before
            this call (resume). file: stream to draw on (default: tqdm's, stderr).
    """

    def __init__(self, *, desc: str, steps: int, start_step: int = 0, max_minutes: Optional[float] = None,
                 wall_before: float = 0.0, enabled: bool = True, file: Optional[TextIO] = None):
        self.steps, self.start_step, self.wall_before = steps, start_step, wall_before
        self.budget_s = None if max_minutes is None else float(max_minutes) * 60.0
        self.bar = None
        if not enabled:
            return
        from tqdm import tqdm

        if self.budget_s is None:
            self.bar = tqdm(total=steps, initial=start_step, desc=desc, dynamic_ncols=True, file=file)
        else:
            self.bar = tqdm(total=self.budget_s, initial=min(wall_before, self.budget_s), desc=desc, unit="s",
                            dynamic_ncols=True, file=file, bar_format=TIME_BAR_FORMAT)

    def projected_end_s(self, step: int, wall: float) -> float:
        """Training seconds at which the run is expected to stop, seen after ``step`` steps at ``wall`` seconds:
        the budget, or earlier when the remaining steps at this run's mean step time finish first."""
        assert self.budget_s is not None
        done = step - self.start_step
        if done <= 0:
            return self.budget_s
        per_step = max(wall - self.wall_before, 0.0) / done
        return min(self.budget_s, wall + (self.steps - step) * per_step)

    def update(self, step: int, wall: float, postfix: Dict[str, str]) -> None:
        """Show ``step`` done steps at ``wall`` training seconds, with ``postfix`` (e.g. loss) after the bar."""
        if self.bar is None:
            return
        if self.budget_s is None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(postfix)
            return
        end = self.projected_end_s(step, wall)
        self.bar.total = end
        self.bar.n = min(wall, end)
        self.bar.set_postfix({"step": f"{step}/{self.steps}", **postfix})  # set_postfix refreshes

    def close(self) -> None:
        """Close the bar (leaves its last state on screen)."""
        if self.bar is not None:
            self.bar.close()
