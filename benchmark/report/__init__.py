"""Layer 5: the reporter. Reads finished run folders into frames, and writes the leaderboard
(md/csv/html), plots, mosaics, paired tests and the study figures. It never trains.
"""
