"""Layer 1, the foundation: the run's configuration, value parsing, seeds, locks and the run-folder format.

Nothing here trains or scores; every other layer reads and writes runs through these modules.
"""
