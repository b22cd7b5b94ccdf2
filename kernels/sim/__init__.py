"""pyflow's concurrent-grid CUDA simulator (used when ``pyflow.kernels.backend`` picks "sim").

Numba's stock simulator runs one block after another, so a grid barrier
(``cuda.cg.this_grid().sync()``) there is only a block barrier, and kernels
whose blocks exchange data across it give wrong answers.  This package runs
every thread of every block at once, with per-block shared memory, real block
and grid barriers, deadlock and divergent-barrier detection, and errors that
name the failing thread.

A launch runs on one of two tiers (``tiers.py``): threads, where every CUDA
thread is a Python thread (the debugger's tier), or compiled, where the kernel's
own source becomes loops over blocks and threads split at barriers and runs as
``numba.njit`` code (the fast tier).

Modules: ``settings`` (the simulated GPU's size, knobs), ``fake_cuda`` (what
``cuda`` means inside a kernel), ``grid`` (one threaded launch: threads and
barriers), ``kernel`` (``jit``, ``SimKernel``, ``SimDeviceFunction``), ``tiers``
(which tier, ``explain``), and the compiled tier: ``translate`` (the source with
``cuda`` made plain; it reads it with ``kernel_source`` and hands on a ``translation``),
``fission`` (regions between barriers, what lives across them), ``shadow_types`` (the
types of what lives across them), ``writer``, ``blockwise`` and ``gridwise`` (the
generated module), ``scopes`` (the control machine for kernels with grid barriers),
``cpu_runtime`` (what generated code imports), ``module_cache`` (where generated
modules are kept), ``compiled`` (compile and launch).
"""

from .kernel import SimDeviceFunction, SimKernel, SimLaunch, jit
from .settings import SimSettings, configure, max_coresident_blocks, settings
from .tiers import explain

__all__ = ["jit", "SimKernel", "SimDeviceFunction", "SimLaunch",
           "SimSettings", "settings", "configure", "max_coresident_blocks", "explain"]
