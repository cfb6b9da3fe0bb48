"""`gpuenv bench`: the shipped workloads (`workloads/`) timed in the selected cells.

- `benchmark` plans, runs and tabulates them (the seed's table, CSV, a plot);
- `workloads/` are the scripts that run inside the images.
"""
