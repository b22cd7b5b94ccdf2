"""A placement is a value: equal placements hash alike, in this process and after a trip through pickle
from another process (whose string hashes differ: ``PYTHONHASHSEED``), since ranks exchange them."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pyflow as flow


def test_a_placement_pickled_in_another_process_finds_its_twin_in_a_dict():
    code = "import pickle, sys, pyflow as flow; sys.stdout.buffer.write(pickle.dumps(flow.placement('cpu', [0])))"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    data = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True).stdout
    theirs = pickle.loads(data)
    ours = flow.placement("cpu", [0])
    assert theirs == ours and hash(theirs) == hash(ours)
    assert {ours: "found"}[theirs] == "found"


def test_equal_placements_hash_alike_and_differ_from_others():
    a, b = flow.placement("cpu", [0]), flow.placement("cpu", [0])
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert flow.placement("cpu", [0]) != flow.placement("cuda", [0])
