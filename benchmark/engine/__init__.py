"""Layer 5: resolving a config against the methods and the data (resolve.py), the network, the diffusion
objectives and samplers, the ONE local step, the round, the run's life cycle and its evaluation, the run
context, torch.distributed glue and batched clients.
"""
