"""Seed 004: ``flow.nn.Graph`` (OneFlow's static graph): trace ``build`` -> compile -> run the Plan.

``pyflow.nn.Graph`` and ``pyflow.nn.graph.GraphModule`` are these (``graph.py``).
"""

from pyflow.graph.graph import Graph, GraphConfig, GraphModule

__all__ = ["Graph", "GraphModule", "GraphConfig"]
