"""The checks: `gpuenv validate` proves what an image holds, `gpuenv doctor` what this host
and its engine can run.

- `session`, `expected`, `runner`: which images, what each must hold, and the
  pytest-testinfra suites (`suites/`, shipped in the package) run against a container of it;
- `diff` (`gpuenv diff`) and `sizes` (size budgets) compare images;
- `doctor`: whether this host can run the matrix's cells (engine, GPUs, CDI, the working
  directory's reach, the package index), and how to fix it.
"""
