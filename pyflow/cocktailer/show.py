"""Printable views of Cocktailer programs: the statement tree of a traced program."""

from __future__ import annotations

from pyflow.cocktailer.ir import Branch, Call, CallGroup, FunctionCall, Lane, Loop, UOperator

__all__ = ["listing"]


def _lines(block, indent: str):
    for item in block.items:
        if isinstance(item, UOperator):
            yield f"{indent}{item.name} x{item.count} uTasks: {item.note}"
        elif isinstance(item, Loop) and item.kind == "for":
            yield f"{indent}for {item.var!r} in range({item.trip!r}):" + (
                f"  # unrolled x{item.unroll}" if item.unroll > 1 else "")
            yield from _lines(item.body, indent + "    ")
        elif isinstance(item, Loop):
            yield f"{indent}while (at most {item.max_iters} times, counter {item.var!r}):"
            yield from _lines(item.head, indent + "    ")
            yield f"{indent}    if not {item.cond!r}: break"
            yield from _lines(item.body, indent + "    ")
        elif isinstance(item, Branch):
            yield f"{indent}if {item.pred!r}:"
            yield from _lines(item.then, indent + "    ")
            yield f"{indent}else:"
            yield from _lines(item.orelse, indent + "    ")
        elif isinstance(item, FunctionCall):
            yield f"{indent}function {item.name}:"
            yield from _lines(item.body, indent + "    ")
        elif isinstance(item, Call):
            depth = f", first frame at depth {item.depth}" if item.depth else ""
            yield (f"{indent}{item.result!r} = {item.fn.name}({', '.join(map(repr, item.args))})"
                   f"  # uTask reference{depth}")
        elif isinstance(item, CallGroup):
            yield f"{indent}at once, lane k on block group k % groups:  # recursion unroll"
            yield from _lines(item.body, indent + "    ")
        elif isinstance(item, Lane):
            frame = f"  # frame {item.depth} of {item.fn.name}'s stack" if item.fn is not None else ""
            yield f"{indent}lane:{frame}"
            yield from _lines(item.body, indent + "    ")
        else:
            yield f"{indent}{item!r}"


def listing(program) -> str:
    out = [f"program {program.name}({', '.join(n for n, _, _ in program.inputs)}):"]
    for fdef in program.functions:
        out.append(f"  def {fdef.name}({', '.join(map(repr, fdef.params))}):  "
                   f"# recursive, frame of {fdef.frame_size} elements in {fdef.stack.name}")
        out.extend(_lines(fdef.body, "      "))
    out.append("  body:")
    out.extend(_lines(program.body, "    "))
    out.append(f"  outputs: {', '.join(map(repr, program.outputs))}")
    return "\n".join(out)
