"""Layer 7, the reporter: reads finished run folders into frames, and writes the leaderboard (md/csv/html),
plots and mosaics. It never trains and writes nothing into a run folder. It also holds what several committed
studies build on (the paired and speed tables, seed sizing, a confirmatory study's checks), public through
``dfbench.benchmark.api``; each study's own tables and figures are scripts in its folder, ``results/<study>/``,
outside the package.
"""
