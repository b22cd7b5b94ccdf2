"""pyflow's concurrent-grid CUDA simulator (used when ``pyflow.kernels.backend`` picks "sim").

Numba's stock simulator runs one block after another, so a grid barrier
(``cuda.cg.this_grid().sync()``) there is only a block barrier, and kernels
whose blocks exchange data across it give wrong answers.  This package runs
every thread of every block at once, with per-block shared memory, real block
and grid barriers, deadlock and divergent-barrier detection, and errors that
name the failing thread.

Modules: ``settings`` (the simulated GPU's size, knobs), ``fake_cuda`` (what
``cuda`` means inside a kernel), ``grid`` (one launch: threads and barriers),
``kernel`` (``jit``, ``SimKernel``, ``SimDeviceFunction``).
"""

from .kernel import SimDeviceFunction, SimKernel, SimLaunch, jit
from .settings import SimSettings, configure, max_coresident_blocks, settings

__all__ = ["jit", "SimKernel", "SimDeviceFunction", "SimLaunch",
           "SimSettings", "settings", "configure", "max_coresident_blocks"]
