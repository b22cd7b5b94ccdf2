"""Device code: every numba.cuda kernel and device function, and how they launch."""
from pyflow.kernels.backend import cuda, is_gpu, is_simulator
