"""Simulated branch-office traffic, for the demo and the benchmarks.

- `workload`: `WorkloadSpec` + `LoadProfile` → `plan_arrivals` (seeded Poisson arrivals, the seed mix);
- `capacity`: what "100% load" means on the simulator (`estimate_capacity`); `calibrate` measures it;
- `player`: `TrafficPlayer` sends a plan through the HTTP API, retrying 429s like real branches;
- `timeseries`: `Recorder` samples depth, alarm and workers from Redis every second;
- `records` and `accounting`: per-ticket records, per-type figures, and the two-sided books.
"""
