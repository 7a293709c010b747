"""Layer 7, the reporter: reads finished run folders into frames, and writes the leaderboard (md/csv/html),
plots and mosaics. It never trains and writes nothing into a run folder. One study's own tables and
figures (paired tests, frontier, privacy, time to quality, the paper's figures) are in
``benchmark/studies/``, the layer above.
"""
