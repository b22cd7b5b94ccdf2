"""No module of pyflow/ or kernels/ over ``LIMIT`` lines: one module reads as one idea (issue 30's checks).

STYLE.md asks for one concept per module, named after the seed's concept.  A module that grows
past the limit usually holds two (a protocol and its transport, a scheduler and its cost model,
a Plan and the guards that make its memory safe): move one to its own module, with a docstring
saying what it is in the seed's terms, rather than splitting a class into mixins.

Modules over the limit today, that others are splitting, are in ``OVER`` with their size: they
may only shrink.  The tests fail on a module over the limit not in ``OVER`` (split it), on one
that grew past its recorded size, and on an ``OVER`` entry now within the limit or gone (delete
its line, and lower a size when a module shrank), so the list only shrinks.

    .venv/bin/python tests/test_module_sizes.py    # every module over the limit, largest first
"""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = ("pyflow", "kernels")
LIMIT = 450

# Module -> its size (lines) when it was listed; it may only shrink.  Delete a line once its module is
# within LIMIT (test_over_list_only_shrinks says which).
OVER: dict[str, int] = {}


def module_sizes() -> dict[str, int]:
    """Every module of ``FOLDERS``, relative to the repository, -> its number of lines."""
    return {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
            for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))}


def test_no_new_module_over_the_limit():
    """Every module over LIMIT lines is one OVER lists (a new one: find its second concept and move it out)."""
    new = {name: size for name, size in module_sizes().items() if size > LIMIT and name not in OVER}
    assert not new, (f"modules over {LIMIT} lines: move one of the concepts each holds to its own module "
                     f"(tests/test_module_sizes.py):\n" + "\n".join(f"  {n}: {s} lines" for n, s in new.items()))


def test_over_list_only_shrinks():
    """Every OVER module is still over LIMIT and no larger than listed: a split one leaves the list."""
    sizes = module_sizes()
    grew = [f"  {n}: {sizes[n]} lines, listed at {s}: it may only shrink" for n, s in OVER.items()
            if n in sizes and sizes[n] > s]
    done = [f"  {n}: {sizes.get(n, 'gone')}" for n in OVER if sizes.get(n, 0) <= LIMIT]
    assert not grew, "modules of OVER grew (tests/test_module_sizes.py):\n" + "\n".join(grew)
    assert not done, (f"within {LIMIT} lines now, well done: delete these entries from OVER in "
                      "tests/test_module_sizes.py (the list only shrinks):\n" + "\n".join(done))


if __name__ == "__main__":
    for name, size in sorted(module_sizes().items(), key=lambda item: -item[1]):
        if size > LIMIT:
            print(f"{size:5d}  {name}{'' if name in OVER else '  (not in OVER)'}")
