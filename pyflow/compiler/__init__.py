"""The lazy compiler (seed 004): Job -> passes -> OpGraph -> TaskGraph -> Plan.

Modules (import the one you need; this package imports none of them eagerly):

* ``ids``: task, stream (thread), regst and mem-block ids, laid out bit by bit as OneFlow's.
* ``memory``: the memory planner.  Per device, every reusable regst lives over an
  interval of the task chain; the planner gives each one an offset inside the device's
  mem block so that regsts alive at the same time never overlap, and reports how close
  the block is to the lower bound (the most bytes ever alive at once).
"""
