"""The range of the collective check's bus-bandwidth floor, one constant for both places a floor is written.

Standard library only: the stack field `fabric.min_busbw_gbps` (`stacks/model/config.py`) and the check's
`--min-busbw-gbps` (`checks/collective.py`, into whose remote script `checks/bundle.py` pastes this module)
read the same bounds, so a floor the stack accepts is one the check accepts, and the other way round.
"""

from __future__ import annotations

MIN_BUSBW_GBPS_RANGE = (0.01, 10_000)
"""Gb/s, both ends included. Below 0.01 (10 Mbit/s) a floor can never fail on any link a cluster has, so its
PASS proves nothing (1e-300 was accepted once); above 10000 (10 Tbit/s) no node reaches it (8 x 800G NICs carry
6.4 Tbit/s). Finite: inf and nan are refused."""
