"""``flow.save`` and ``flow.load``: checkpoints a course can trust (``torch.save`` / ``torch.load``).

**What is saved.**  ``obj`` is a tree: dicts, OrderedDicts, lists and tuples whose leaves are
tensors, numpy arrays and scalars, and plain values (None, bool, int, float, str, bytes).
Module and optimizer state dicts are such trees (an optimizer's integer keys stay integers,
its ``betas`` stay a tuple).  A tensor keeps its dtype, shape, values, device and
``requires_grad`` (a ``Parameter`` stays one).  A view or a non-contiguous tensor saves its
values (a contiguous copy); the same tensor object reached twice loads as one object, but
two views of one storage load as two tensors (PyTorch would keep the sharing).

**The format, and why it is safe.**  A file is a zip archive (stdlib ``zipfile``, stored)::

    data.json        {"format": "pyflow.save", "version": 1, "root": <the tree>}
    tensors/0.npy    the values of each tensor and array, in numpy's .npy format
    pickles/0.pkl    only for objects outside the vocabulary above (see weights_only)

A pickle is a program: unpickling can call any function (``os.system`` included).  Hence
PyTorch's rule, ``weights_only=True`` by default.  Here it is structural: such a load parses
JSON and reads .npy files with ``allow_pickle=False``, and never unpickles anything; a file
that would need it is refused, naming the file and the object's class.  ``save`` pickles what
lies outside the vocabulary (a custom class, a set; the tensors inside still go to .npy
files, as torch does), and ``load(..., weights_only=False)`` unpickles it: use that only for
files you trust.  A bare pickle (``pickle.dump``, torch's legacy format) is never loaded.

**Errors and atomic writes.**  A truncated, corrupt or foreign file is a ``SerializationError``
naming the file.  ``save`` to a path writes a temporary file in the same folder and renames it
over the path (``os.replace``, atomic), so an error or a crash mid-save leaves the earlier file
as it was and never a half-written one.  ``f`` may also be a binary file object (``io.BytesIO``).

**map_location** (as ``torch.load``): None restores each tensor on the device it was saved on;
a device (``"cpu"``, ``flow.device("cuda:1")``) puts every tensor there; a dict maps saved
locations (``{"cuda:0": "cpu"}``; locations are ``"cpu"`` and ``"cuda:<index>"``); a callable
``fn(tensor, location)`` gets each tensor loaded on the cpu and returns the tensor to use
(``lambda t, loc: t`` keeps all on the cpu), or None for the default.

**Global tensors are saved by value.**  ``save`` gathers each one's logical value
(``numpy()`` of a global tensor, a collective: every rank calls ``save`` with the same
object, as every rank must call ``numpy()``) and records its placement and SBP.  Why: the
file then does not depend on how many ranks wrote it, a checkpoint from N ranks opens in a
one-process script, and a ``partial_sum`` tensor, whose pieces mean nothing alone, is saved as
its sum.  Each rank writes the same content (to a path, the last rename wins; readers never see
a partial file).  ``load`` (every rank calls it) rebuilds the global tensor on the saved
placement and SBP (``flow.tensor(value, placement=, sbp=)``); with ``map_location`` a device,
it returns the logical value as a local tensor there instead.

**Where it is.**  ``save`` is ``writer.py`` (the object tree turned into JSON nodes and .npy
members; it also names the format's constants), ``load`` is ``reader.py`` (the nodes turned
back into objects, each damaged byte a ``SerializationError``, and where each tensor goes).

>>> import io, pyflow as flow
>>> buffer = io.BytesIO()
>>> flow.save({"w": flow.tensor([[1.0, 2.0]], requires_grad=True), "step": 3}, buffer)
>>> _ = buffer.seek(0)
>>> loaded = flow.load(buffer)
>>> loaded["w"].tolist(), loaded["w"].requires_grad, loaded["step"]
([[1.0, 2.0]], True, 3)
"""

from pyflow.serialization.reader import load
from pyflow.serialization.writer import save

__all__ = ["save", "load"]
