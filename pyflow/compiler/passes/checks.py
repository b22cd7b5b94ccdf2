"""Pass ``checks``: a pipeline stage may only take data from another stage through a placement change.

OneFlow's pipeline runs each stage on its own devices, so a tensor that flows from a
module of stage ``s`` into a module of stage ``t != s`` must be moved there
(``x.to_global(placement=...)``, or ``.to(device)`` for local tensors; ``set_stage(t,
placement)`` does it for the module's inputs).  A link that skips the move is an error
naming both ops and their Python lines (OneFlow's "Cross diff stage link", #9435).
"""

from __future__ import annotations

from pyflow.errors import CompileError

__all__ = ["run", "MOVES"]

MOVES = ("copy", "to_global", "cast_to_global")


def run(job, tracer) -> None:
    producers = job.producers()
    for op in job.ops:
        if op.stage is None:
            continue
        for lbn in op.input_lbns():
            src = producers[lbn]
            if src.stage is None or src.stage == op.stage or op.type in MOVES or src.type in MOVES:
                continue
            raise CompileError(
                f"Cross diff stage link: {src.name} ({src.type}, stage {src.stage}, at {src.line}) -> {op.name} "
                f"({op.type}, stage {op.stage}, at {op.line}). Make sure to change the tensor's placement before it "
                "enter the module of a next pipeline stage (x.to_global(placement=...), or set_stage(stage, "
                "placement) so that the module's inputs move)")
