"""What a child's output says of a failure's cause: the peer its NodeFailedError named, the worker ahead,
SLURM's cancelling of its step; and the scheduler's line that every node registered.

The supervisor reads each output line through :meth:`Clues.read` and names what it found with the
root cause (:meth:`Clues.hint`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["UNEVEN", "Clues"]

UNEVEN = "with uneven data see kv.join() or fit(uneven=True)"
# "NodeFailedError: worker 1 failed: ..." in a child's output: the peer it saw fail
_BLAMED = re.compile(rb"NodeFailedError: ((?:worker|server) \d+|scheduler) failed")
# "mismatched step counts: worker 1 is ahead" in a child's output (pskv.server.steps): the root cause
_AHEAD = re.compile(rb"mismatched step counts: (worker \d+) is ahead")
# an elastic job's end (pskv.cluster.elastic): "NodeFailedError: the elastic job failed: only 1 of at least 2 ..."
_ELASTIC = re.compile(rb"the elastic job failed: (.+?)\s*$")
# the scheduler's INFO line once every node registered (pskv.cluster.scheduler)
_REGISTERED = re.compile(rb"scheduler: all (\d+) nodes registered")
# slurmstepd's line when SLURM cancels a step (scancel of the step or the job, a time limit): "*** STEP 7.2 ON
# node1 CANCELLED AT 2026-11-29T00:44:46 ***", "... CANCELLED AT ... DUE TO TIME LIMIT ***"
_CANCELLED = re.compile(rb"slurmstepd\S*: error: \*\*\* ((?:STEP|JOB) .+ CANCELLED AT .+?) \*\*\*")


@dataclass
class Clues:
    """One child's clues, from its output so far."""

    blamed: str | None = None  # the node its last NodeFailedError named (a peer it saw die or hang)
    blamed_left: bool = False  # ... and that node had left the job (closed its store), not failed
    ahead: str | None = None  # the worker its mismatched-step-counts error said is ahead (the root cause)
    cancelled: str | None = None  # slurmstepd's "STEP 7.2 ON node1 CANCELLED AT ...": SLURM ended it
    elastic: str | None = None  # why the scheduler failed an elastic job (fewer than MIN workers too long)

    def read(self, line: bytes, scheduler: bool) -> int | None:
        """Take the clues of one output line; for the ``scheduler``'s, the count of nodes registered, if said."""
        if b"the elastic job failed: " in line:
            m = _ELASTIC.search(line)
            if m is not None:
                self.elastic = m.group(1).decode(errors="replace")
        elif b"NodeFailedError" in line:  # which peer it saw fail (or leave): named with the root cause
            m = _BLAMED.search(line)
            if m is not None:
                self.blamed = m.group(1).decode(errors="replace")
                self.blamed_left = b"left the job" in line
        elif b"mismatched step counts: " in line:  # the worker that ran a sync step the others did not
            m = _AHEAD.search(line)
            if m is not None:
                self.ahead = m.group(1).decode(errors="replace")
        elif b"CANCELLED AT" in line:  # SLURM cancelled its step: said with the root cause
            m = _CANCELLED.search(line)
            if m is not None:
                self.cancelled = m.group(1).decode(errors="replace")
        elif scheduler and b"nodes registered" in line:
            m = _REGISTERED.search(line)
            if m is not None:
                return int(m.group(1))
        return None

    def hint(self, name: str) -> str:
        """What the failed child ``name``'s output said about its cause: the worker ahead, a peer that left or
        failed, SLURM."""
        if self.elastic:
            return f": the elastic job failed: {self.elastic}"
        if self.cancelled:  # scancel of its step or of the whole job, or a time limit: nothing of pskv's failed
            return f" after SLURM cancelled it ({self.cancelled}: scancel, or a time limit)"
        if self.ahead == name:
            return f" after its error said it is ahead (mismatched step counts: {UNEVEN})"
        if self.ahead:
            return " after its error said so"
        if self.blamed and self.blamed != name and self.blamed_left:
            return (f" after its NodeFailedError said {self.blamed} left the job early (it closed its "
                    f"store or ended before this worker was done: {UNEVEN})")
        if self.blamed and self.blamed != name:  # e.g. a peer that hung, not died
            return f" after its NodeFailedError named {self.blamed} (look there first)"
        return ""
