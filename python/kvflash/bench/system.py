"""What every system under test is (peers.py lists them). Each takes a case's Inputs and returns a
call to time.

A system's prepare(case, inputs) does everything that is not the attention itself (layout
copies, masks, plans, scheduler metadata) and returns a Prepared: fn() runs the attention,
to_common(out) turns fn's output into kvflash's (b, s_q, h, d) layout for the output check, and
note says what the system was given when it differs from kvflash's inputs. A system that cannot
take a case raises NotRun with the reason; any other exception is recorded as an error with its
message. Nothing is dropped silently: every (case, system) pair gets a row.
"""

import dataclasses


def describe(e, limit=400):
    """An exception's type and first non-empty lines (compiler errors often start with a generic
    line), on one line."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {' / '.join(lines[:3])[:limit]}"


class NotRun(Exception):
    """This system does not take this case (the message says why)."""


@dataclasses.dataclass
class Prepared:
    fn: object
    to_common: object = None
    note: str = ""


class System:
    name = ""
    stage = 0  # runner.py: 0 no compilation, 1 compiled per shape family, 2 background JIT

    def __init__(self, device):
        self.device = device
        self.cuda = device == "cuda"

    def unavailable(self):
        """Why this system cannot run at all here (import failure, ...), or None."""
        return None

    def start(self, cases):
        """Background work before the suite (JIT builds); the suite waits with wait()."""

    def wait(self, seconds):
        """Waits up to seconds for start()'s work; returns a reason if it did not finish."""
        return None

    def setup_report(self):
        """Lines for results.md about this system's setup (kernel builds), if any."""
        return []

    def prepare(self, case, inputs):
        raise NotImplementedError
