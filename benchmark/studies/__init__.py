"""Layer 8: the tools of one study each, above the leaderboard (report/): each writes one committed study's
tables and figures under results/ (`python -m dfbench.benchmark.studies.<name>`).

Over run folders (reading what the reporter reads, `report.frames.collect`): `paired` (each setting
minus a reference, paired by seed), `frontier` (bits against quality), `privacy`, `time_to_quality`,
`paper_figures` (the pruning paper's figures and claims); `study_cli` is what they share.
Not over runs: `calibration`, every Fashion-MNIST metric on graded degradations of real images
(`make bench-metric-calibration`, results/metric-calibration/).
"""
