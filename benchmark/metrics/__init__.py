"""Layer 3: feature extractors and their weight files, Frechet distance, KID, PRDC, coverage, drift,
per-client quality and uncertainty. Pure functions of images and features: no model, no training.
"""
