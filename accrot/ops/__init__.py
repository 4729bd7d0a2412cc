"""Pure tensor functions: attention kernels, rotations, the PaTH chunked algorithm.

Every fast op has a ``naive_*`` twin (the dumbest correct version) that tests compare against on
outputs and gradients. Nothing here imports Lightning or the model.
"""
