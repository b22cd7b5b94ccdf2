"""pyflow.kernels: all device code (numba.cuda kernels and device functions) and how it launches.

* ``backend``       - GPU or simulator; the one module that imports numba.cuda.
* ``jit``           - ``cuda.jit`` with launch checks, on either backend.
* ``launch_config`` - launch-configuration validation shared by both backends.
* ``sim``           - the concurrent-grid simulator (all blocks at once, real grid sync).
* ``examples``      - small kernels used by the demo, the tests and the tutorials.
* ``dtypes``        - the one list of dtypes the kernels know, and the groups each family accepts.
* ``registry``      - (op name, target) -> kernel; the families (elementwise and its op table
  ``ufuncs``, reduce, arg_reduce, scan, sort, softmax, matmul, movement, indexing, conv) register there.

Nothing in here imports the rest of pyflow except ``pyflow.errors``.
"""

from pyflow.kernels.backend import cuda, describe, is_gpu, is_simulator
from pyflow.kernels.jit import GpuKernel, jit, max_cooperative_grid_blocks

__all__ = ["cuda", "jit", "GpuKernel", "max_cooperative_grid_blocks", "is_gpu", "is_simulator", "describe"]
