"""Pure tensor functions: attention kernels, rotations, the PaTH chunked algorithm.

Every fast op has twins that tests compare against on outputs and gradients, named by what they are:

* ``naive_*`` is the mathematical reference: the dumbest correct version of the op (explicit products, a full
  softmax, Python integers), which shares none of the fast op's tricks;
* ``eager_*`` is the Python twin of a C++ loop (``csrc/``): the same ATen calls in the same order, which runs when
  the CPU kernels are not built and agrees with them to the bit.

Nothing here imports Lightning, the model or the process settings (:mod:`accrot.runtime`).
"""
