"""The one exception type of the dataset layer."""
from __future__ import annotations

__all__ = ["DatasetError"]


class DatasetError(ValueError):
    """Any data problem: a missing, truncated or corrupted file, a checksum that does not
    match the published one, a file with the wrong layout, an unsafe archive or pickle.

    The message names the file, what was expected, and how to get a good copy.
    It subclasses :class:`ValueError`, so ``except ValueError`` also catches it.
    """
