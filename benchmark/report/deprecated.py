"""Old module names kept for one release after a module moved (the study tools went to benchmark/studies/).

Each old module is three lines: it imports its new home and calls `hand_over`, which warns
(DeprecationWarning naming the new path) and makes the old name the moved module itself, so every
name (private ones and monkeypatching included) and `python -m <old name>` keep working.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType


def hand_over(old: str, moved: ModuleType) -> None:
    """Called by the old module `old` (its `__name__`) with the module it moved to."""
    running = old == "__main__"  # `python -m <old name>`: run the moved tool's command line
    spec = getattr(sys.modules.get(old), "__spec__", None)
    message = (f"{spec.name if spec else old} moved to {moved.__name__}; the old name goes in the next release "
               f"(import or run `python -m {moved.__name__}`)")
    if running:
        print(f"DeprecationWarning: {message}", file=sys.stderr)  # a command line's user sees it (warnings would hide it)
        raise SystemExit(moved.main())
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    sys.modules[old] = moved
