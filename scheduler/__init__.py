"""Pure bandwidth-allocation policy for layerwise KV loads (no I/O).

```python
from scheduler import TransferDemand, allocate
rates = allocate("calibrated-stall-opt", demands, capacity=B, margin=delta)  # bytes/s, one per demand
```
"""

from .policies import POLICIES, TransferDemand, added_stall, allocate, objective, water_fill

__all__ = ["POLICIES", "TransferDemand", "added_stall", "allocate", "objective", "water_fill"]
