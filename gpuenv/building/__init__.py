"""From a matrix to images: plan, resolve, fetch, send, build.

- `project` opens the matrix, its resolution and lock (from a `snapshot` keyed by
  `fingerprint` when nothing changed);
- `render` turns a cell into a Dockerfile; `plan` decides per cell: up to date, pull or
  build, and why; `registry` names where cells are pulled from and reads their labels;
  `pull` fetches a matching image before building one;
- `lock` resolves and writes matrix.lock; `layers` splits a resolution into install steps;
  `sendable` assembles what a build sends (the resolution, its wheels, uv, the context);
- `base` bootstraps base images; `reproducible` normalises images for identical IDs;
- `builder` executes a plan; `results`, `progress`, `terminal` report it.
"""
