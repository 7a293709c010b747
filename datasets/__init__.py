"""dfbench datasets: verified dataset sources and client partitioners (layer 0: it imports nothing of dfbench).

>>> from dfbench.datasets import load, partition
>>> train = load("fmnist", "train")                       # doctest: +SKIP
>>> part = partition(train.labels.numpy(), "dirichlet:0.5", num_clients=10, seed=0)  # doctest: +SKIP

See :mod:`dfbench.datasets.sources` (where data is looked for, how it is verified),
:mod:`dfbench.datasets.user_data` (your own data: ``folder:PATH``, ``hf:PATH``),
:mod:`dfbench.datasets.gmm` (ground truth: Gaussian mixtures whose score is known, ``gmm:...``) and
:mod:`dfbench.datasets.partitioners` (the spec strings).
"""
from .errors import DatasetError
from .gmm import GMM_KIND, canonical as gmm_canonical, is_mixture, parse_gmm, to_model_space, to_pixels
from .mixture import GaussianMixture
from .partitioners import Partition, PartitionSpec, mean_tv_distance, parse_partition, partition
from .sources import CHECKSUMS, DATASETS, ENV_VAR, ImageSet, cache_dir, clear_cache, data_info, load, locate, mixture
from .user_data import USER_KINDS, is_user_data, parse_user_spec, short_name, user_digest

__all__ = [
    "DATASETS",
    "DatasetError",
    "ImageSet",
    "load",
    "data_info",
    "locate",
    "cache_dir",
    "clear_cache",
    "CHECKSUMS",
    "ENV_VAR",
    "partition",
    "parse_partition",
    "Partition",
    "PartitionSpec",
    "mean_tv_distance",
    "USER_KINDS",
    "is_user_data",
    "parse_user_spec",
    "short_name",
    "user_digest",
    "GMM_KIND",
    "GaussianMixture",
    "gmm_canonical",
    "is_mixture",
    "mixture",
    "parse_gmm",
    "to_pixels",
    "to_model_space",
]
