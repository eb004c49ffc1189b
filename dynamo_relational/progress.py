"""Progress of long compiles: one tqdm bar over the steps (trace, each pass, Inductor).

The bar appears only once a compile has run for :data:`DELAY` seconds, so
small models compile silently; it goes to stderr and disappears when done.
``options={"progress": False}`` switches it off; without tqdm installed there
is none.
"""
from __future__ import annotations

import sys

from dynamo_relational import passes

#: Seconds a compile runs before its bar appears.
DELAY = 3.0
#: The tracing step reports its node count every this many FX nodes.
NODE_STRIDE = 4096


class CompileProgress:
    """A bar with ``steps`` steps; ``step(name)`` finishes one, ``traced(n)`` reports tracing."""

    def __init__(self, enabled: bool, steps: int, desc: str = "relational compile"):
        self.bar = None
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm   # (optional: without it, no bar)
        except ImportError:
            return
        self.bar = tqdm(total=steps, desc=desc, unit="step", delay=DELAY, leave=False, file=sys.stderr)

    def traced(self, nodes: int) -> None:
        self._show(f"tracing: {nodes:,} FX nodes")

    def start(self, name: str) -> None:
        self._show(name)

    def _show(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            if self.bar._time() >= self.bar.start_t + DELAY:   # refresh() itself ignores the delay
                self.bar.refresh()

    def step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "CompileProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


NONE: CompileProgress = CompileProgress(False, 0)


def compile_progress(enabled: bool) -> CompileProgress:
    """A bar over one compile: its first step (tracing, or Inductor after the passes) and each pass."""
    return CompileProgress(enabled, 1 + len(passes.PIPELINE))
