# ---
# jupyter:
#   jupytext:
#     text_representation:
#       format_name: percent
# ---

# %% [markdown]
# # Tutorial 9: adding an op, end to end
#
# pyflow has no `softplus` op: `flow.nn.functional.softplus` is written with
# other ops (a `where` of `exp`s and `log`s).  This tutorial adds
# **softplus** as one op, PyTorch's `softplus(x)` with `beta=1, threshold=20`:
#
#     softplus(x) = log(1 + exp(x)),  and x itself where x > 20
#
# It is defined **once**, in section 1 of this file, as OneFlow defines a user
# op (`REGISTER_USER_OP(...).SetTensorDescInferFn().SetGetSbpFn()`, a kernel per
# device, `REGISTER_USER_OP_GRAD`): a scalar device function, its CPU twin, the
# two kernels registered under a name, and an **OpDef** (inference, kernel,
# backward rule, SBP signatures).  The rest of the tutorial uses that one
# definition, unchanged, from every layer:
# 2. eager, on cpu and on cuda (the simulator);
# 3. eager autograd;
# 4. nn.Graph: traced, compiled (its autograd pass calls the same backward
#    rule) and run on the actor runtime, with an optimizer;
# 5. global tensors on two ranks: the op's SBP signatures let an S(0) input
#    give an S(0) output with no boxing;
# 6. what is **not** one definition yet, and which files those need.
#
# Run it as a script (`python tutorials/09_adding_an_op.py`) or open it as a
# notebook with jupytext.  `docs/adding_an_op.md` is the same checklist as one
# page; `pyflow/ops/elementwise.py` is the model the library's own unary ops
# follow.  The op lives only in this process: registering it changes no file.

# %%
import os

os.environ.setdefault("PYFLOW_CUDA", "sim")

import math

import numpy as np

import pyflow as flow
import pyflow.cocktailer as ck
from pyflow import nn
from pyflow.framework.interpreter import apply, global_interpreter, kernel_target
from pyflow.framework.op_registry import OP_REGISTRY, OpDef, TensorMeta, get_op, register_op
from pyflow.kernels.elementwise import launch_map
from pyflow.kernels.jit import jit
from pyflow.kernels.registry import get_kernel, register
from pyflow.kernels.utask import make_elementwise_utask
from pyflow.ops.elementwise import elementwise_signatures

S, B = flow.sbp.split, flow.sbp.broadcast
print(flow.backend_description())

# %% [markdown]
# ## 1. The definition
#
# First make sure the name is free: `get_op` loads the library's ops, so a
# clash with one of them would show here (and `register_op` would refuse it).

# %%
get_op("relu")
assert "softplus" not in OP_REGISTRY, "the library has its own softplus now: rename this tutorial's op"

# %% [markdown]
# **The scalar device function.**  Every elementwise kernel of the library is
# made from one function of one number (`kernels/scalar_ops.py`), a numba.cuda
# device function: `pyflow.kernels.jit.jit(device=True)` makes one for the
# active backend (a GPU, or the simulator).  Write `math.exp`, not
# `from math import exp`: in the simulator `math` is swapped for IEEE versions
# that give inf and NaN as a GPU does, where Python's `math` would raise.  The
# threshold keeps `exp` from overflowing, as in PyTorch.
#
# **The CPU twin** computes the same with numpy, writing into the output it is
# given (numpy would warn about the `exp` it discards above the threshold).
#
# **The CUDA kernel** is the library's map kernel of the device function:
# `launch_map(op, fn, out, x, stream=)` launches `make_map(fn)`
# (`kernels/elementwise.py`: a strided version and a contiguous fast path,
# grid-stride loops), exactly as the library's own unary ops are launched.
#
# Both kernels follow the elementwise calling convention of the kernel table
# (`kernels/registry.py`): `fn(out, *inputs, stream=)`, writing a
# preallocated `out`.  `register(name, target, fn)` files them under
# (`"softplus"`, `"cpu"`) and (`"softplus"`, `"cuda"`).

# %%
THRESHOLD = 20.0


@jit(device=True)
def softplus_device(x):
    if x > THRESHOLD:
        return x
    return math.log1p(math.exp(x))


def softplus_numpy(x):
    with np.errstate(over="ignore"):
        return np.where(x > THRESHOLD, x, np.log1p(np.exp(x))).astype(x.dtype)


def softplus_cpu(out, x, *, stream=0):
    np.copyto(out, softplus_numpy(x))


def softplus_cuda(out, x, *, stream=0):
    launch_map("softplus", softplus_device, out, x, stream=stream)


register("softplus", "cpu", softplus_cpu)
register("softplus", "cuda", softplus_cuda)

# %% [markdown]
# **The OpDef** (`pyflow/framework/op_registry.py`) says everything the
# interpreters need:
# - `infer`: the output's shape and dtype from the inputs' (`TensorMeta`s).
#   With `promote_inputs=(0,)` and `floating=True` the interpreter has already
#   cast an integer input to float32, as for `sigmoid`, so the kernels only
#   ever see floats;
# - `kernel`: the name to look up in the kernel table, per device target
#   (the default is the op's own name; spelled out here);
# - `same_view_in_place`: an elementwise kernel may write the very view it
#   reads;
# - `backward(ctx, grad) -> [grad of each input]`, written with public ops:
#   d softplus(x) / dx = sigmoid(x) (above the threshold sigmoid(x) is 1.0 in
#   float32, so this is also PyTorch's gradient there);
# - `sbp_signatures`: how the op splits across ranks.  `elementwise_signatures()`
#   is the rule every elementwise op of the library uses: an input split along a
#   dim gives an output split along it.  With no argument it keeps no partial
#   sums: softplus is not linear, `softplus(a) + softplus(b) != softplus(a + b)`.
#
# `register_op` refuses an OpDef that does not declare the last two (give
# `NO_BACKWARD` or `BROADCAST_ONLY` to say "none").

# %%
def infer_softplus(inputs, attrs):
    (x,) = inputs
    return [TensorMeta(x.shape, x.dtype)]


def softplus_backward(ctx, grad):
    return [grad * ctx.inputs[0].sigmoid()]


register_op(OpDef("softplus", infer_softplus, kernel="softplus", promote_inputs=(0,), floating=True,
                  same_view_in_place=True, backward=softplus_backward, sbp_signatures=elementwise_signatures(),
                  doc="log(1 + exp(x)), and x where x > 20 (torch's softplus, beta=1, threshold=20)"))

op = get_op("softplus")
print("OpDef:", op.name, "| kernel:", op.kernel, "| floating:", op.floating, "| differentiable:", op.differentiable)
print("its signatures for a (4, 3) input:", [str(s) for s in op.sbp_signatures([(4, 3)], [(4, 3)], {})])
assert [str(s) for s in op.sbp_signatures([(4, 3)], [(4, 3)], {})] == ["(S(0)) -> S(0)", "(S(1)) -> S(1)"]

# %% [markdown]
# That is the whole definition.  A user-facing function is one line, as
# `flow.relu` is in `pyflow/framework/functional.py`:

# %%
def softplus(x):
    """``log(1 + exp(x))``, elementwise; ``x`` where ``x > 20``."""
    return apply("softplus", [x])[0]


# %% [markdown]
# ## 2. Eager, on cpu and on cuda
#
# `apply("softplus", [x])` looks the OpDef up, infers, finds the kernel for
# the device's target (`kernel_target(device)`: "cpu" or "cuda") and issues
# an OpCall instruction to the VM, as tutorial 3 showed for relu.  The values
# are numpy's on both devices, also far into both tails (no overflow at 100,
# a tiny positive value at -50) and for inf and NaN.

# %%
X = np.array([[-50.0, -3.0, -0.5, 0.0], [0.5, 3.0, 19.5, 20.5], [100.0, np.inf, -np.inf, np.nan]],
             dtype=np.float32)
expected = softplus_numpy(X)
for device in ("cpu", "cuda"):
    x = flow.tensor(X, device=device)
    by_apply = apply("softplus", [x])[0]
    by_function = softplus(x)
    kernel = get_kernel(op.kernel, kernel_target(x.device))
    print(f"{device}: the kernel is {kernel.__name__}; softplus(x) =\n{by_function.numpy()}")
    np.testing.assert_allclose(by_apply.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(by_function.numpy(), expected, rtol=1e-6)

ints = softplus(flow.tensor([0, 1, 2], device="cuda"))   # floating=True: integers compute in float32
print("of an int64 tensor:", ints.dtype, ints.tolist())
assert ints.dtype == np.float32
np.testing.assert_allclose(ints.numpy(), np.log1p(np.exp([0.0, 1.0, 2.0])), rtol=1e-6)
strided = flow.tensor(X[:, :3], device="cuda").T         # a transposed view: the strided kernel
np.testing.assert_allclose(softplus(strided).numpy(), expected[:, :3].T, rtol=1e-6)

# %% [markdown]
# ## 3. Autograd
#
# When an input requires grad, `apply` records the call on the tape with the
# OpDef's `backward` (tutorial 6).  `y.sum().backward()` then runs
# `softplus_backward`, so `x.grad` is `sigmoid(x)`.

# %%
G = np.linspace(-6.0, 6.0, 7, dtype=np.float32)
for device in ("cpu", "cuda"):
    x = flow.tensor(G, device=device, requires_grad=True)
    y = softplus(x)
    print(f"{device}: y.grad_fn = {y.grad_fn}")
    y.sum().backward()
    print(f"{device}: x.grad = {x.grad.numpy()}")
    np.testing.assert_allclose(x.grad.numpy(), 1.0 / (1.0 + np.exp(-G)), rtol=1e-6)

# %% [markdown]
# ## 4. nn.Graph
#
# Inside `nn.Graph.build` the same `apply` records a Job op of type
# "softplus" instead of running it; the tracer runs the same inference
# (`interpreter.infer_logical`).  `loss.backward()` marks the loss, and the
# compiler's autograd pass (`pyflow/compiler/passes/autograd.py`) calls the
# OpDef's `backward` on lazy tensors, so the backward ops in the Job are the
# `sigmoid` and `mul` that `softplus_backward` writes.  The actor runtime then
# runs the registered kernels.  Three training steps of the graph give the same
# losses as three eager steps of an identical model.

# %%
DATA = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)


def make_model():
    flow.manual_seed(0)
    model = nn.Linear(3, 4)
    return model, flow.optim.SGD(model.parameters(), lr=0.1)


model, optimizer = make_model()


class SoftplusGraph(nn.Graph):
    def __init__(self):
        super().__init__()
        self.model = model
        self.add_optimizer(optimizer)

    def build(self, x):
        loss = softplus(self.model(x)).mean()
        loss.backward()
        return loss


graph = SoftplusGraph()
x = flow.tensor(DATA)
graph_losses = [graph(x).numpy().item() for _ in range(3)]
(recorded,) = [o for o in graph.job.ops if o.type == "softplus"]
its_backward = [o.type for o in graph.job.ops if o.backward and o.line == f"backward of {recorded.line}"]
print(f"the Job op {recorded.name} ({recorded.type}, at {recorded.line}); its backward ops: {its_backward}")
assert its_backward == ["sigmoid", "mul"]

eager_model, eager_optimizer = make_model()
eager_losses = []
for _ in range(3):
    loss = softplus(eager_model(x)).mean()
    loss.backward()
    eager_optimizer.step()
    eager_optimizer.zero_grad()
    eager_losses.append(loss.numpy().item())
print("graph losses:", graph_losses, "\neager losses:", eager_losses)
np.testing.assert_allclose(graph_losses, eager_losses, rtol=1e-6)

# %% [markdown]
# ## 5. Global tensors on two ranks
#
# On global tensors `apply` hands the call to the global interpreter
# (`pyflow/distributed/global_ops.py`, tutorial 5).  It asks the OpDef's
# `sbp_signatures` for the candidates, takes the cheapest for the inputs'
# SBPs (the cost model of `pyflow/distributed/signatures.py`), boxes the
# inputs to it and runs the local op on each rank's piece.  For an S(0) input
# `(S(0)) -> S(0)` costs nothing: each rank computes softplus of its own rows,
# and the trace of the call holds no collective.  A B input stays B.
#
# `flow.distributed.run(fn, world_size=2)` runs `fn` on two in-process ranks
# (threads, each with its own VM).  They share this process's op registry, so
# they see the op registered above.

# %%
def on_two_ranks():
    place = flow.placement("cpu", [0, 1])
    x = flow.tensor(X, placement=place, sbp=S(0))
    with flow.trace() as tracer:          # this rank's VM instructions
        y = softplus(x)
    name, signature = global_interpreter().last_signature
    collectives = sum(r.name == "collective" for r in tracer.records)
    whole = softplus(flow.tensor(X, placement=place, sbp=B))
    _, broadcast_signature = global_interpreter().last_signature
    return (f"{name}: {signature}", y.sbp, collectives, y.to_local().numpy(), str(broadcast_signature), whole.sbp,
            y.numpy())


results = flow.distributed.run(on_two_ranks, world_size=2)
for rank, (signature, sbp, collectives, piece, broadcast, whole_sbp, _) in enumerate(results):
    print(f"rank {rank}: {signature}, y.sbp = {sbp}, collectives: {collectives}, its piece has shape {piece.shape}; "
          f"a B input: {broadcast} (y.sbp = {whole_sbp})")
    assert signature == "softplus: (S(0)) -> S(0)" and collectives == 0
    assert broadcast == "(B) -> B"
    rows = slice(0, 2) if rank == 0 else slice(2, 3)       # 3 rows on 2 ranks: balanced_split gives 2, 1
    np.testing.assert_allclose(piece, expected[rows], rtol=1e-6)
np.testing.assert_allclose(results[0][-1], expected, rtol=1e-6)

# %% [markdown]
# ## 6. What is not one definition yet
#
# Sections 2-5 used nothing but the definition of section 1.  Three things
# still live elsewhere; issue 30 ("one op vocabulary") moves the first two
# into the OpDef or one table:
#
# - **Cocktailer**: inside `ck.trace` a flow op runs its own inference, then
#   its *uTask lowering* (`OpDef.utask_lowering`), which appends a uOperator of
#   uTasks.  The library's lowerings are written in
#   `pyflow/cocktailer/lowerings.py` (Cocktailer's IR is a layer above the
#   registry) and set on the OpDefs there with `register_lowering(name, fn)`;
#   our softplus has none, so `ck.trace` refuses it, naming the op.  Its
#   lowering would emit a uOperator over
#   `make_elementwise_utask(softplus_device)` (`kernels/utask/`): the uTasks
#   made from the very device function the eager kernel maps.
# - **The Tensor method** `x.softplus()`: every Tensor method is one entry of
#   the table `METHODS` in `pyflow/framework/tensor_methods.py` (name -> the
#   framework function it calls), so a method needs one entry there, and a
#   `flow.softplus` an export in `pyflow/__init__.py`.
# - **The library's dtype table and compile check**: the library's unary ops
#   are rows of `kernels/ufuncs.py` (the dtypes each accepts, a device function
#   per kind of dtype, the numpy twin), and the PTX compile check
#   (`python -m pyflow.kernels.compile_check`) walks that table.  An op made
#   as here joins neither: it is checked by the asserts above, in float32, and
#   float16 on a real GPU is untried (the library computes `tanh` of float16 in
#   float32 for that reason).  Moving this op into the library means a row in
#   `ufuncs.py` instead of the two kernels above, and an entry of
#   `UNARY_OPS` in `pyflow/ops/elementwise.py` instead of the OpDef.

# %%
utasks = make_elementwise_utask(softplus_device)
print("uTasks from the same device function:", type(utasks).__name__, list(utasks._fields))
try:
    ck.trace(softplus, ck.spec(2, 3))
except ck.TraceError as e:
    print("in ck.trace:", e)
print("Tensor.softplus exists:", hasattr(flow.Tensor, "softplus"))
assert get_op("softplus").utask_lowering is None and not hasattr(flow.Tensor, "softplus")

# %%
flow.vm.shutdown()  # stop the VM's threads
