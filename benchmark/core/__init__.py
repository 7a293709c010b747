"""Layer 1, the foundation: the run's configuration, value parsing, seeds, locks, the model preset table and the
run-folder format. It imports only the datasets' layer below it, and nothing of the methods above it: a
config's checks that need the method registry or the data are benchmark/engine/resolve.py's.

Nothing here trains or scores; every other layer reads and writes runs through these modules.
"""
