"""Layer 6: grids of runs: TOML specs, cell planning and state, the worker runner, fetch and preflight.

The shipped grids are the TOML files in ``builtin/``.
"""
