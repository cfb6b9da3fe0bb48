"""From a matrix to images: plan, resolve, fetch, send, build.

- the project it starts from (matrix, resolution, lock) is gpuenv/project/;
- `render` turns a cell into a Dockerfile; `plan` decides per cell: up to date, pull or
  build, and why; `pull` reads a published image's labels and pulls it when it matches
  (through gpuenv/registry/);
- `lock` resolves each cell and writes matrix.lock (its format: gpuenv/project/lockfile.py);
  `layers` splits a resolution into install steps; `near` fetches them near the engine;
  `sendable` gathers what a build sends (the resolution, its wheels, uv) and `context`
  assembles it into the context directory;
- `base` bootstraps base images; `reproducible` normalises images for identical IDs;
- `builder` executes a plan; `results`, `progress`, `terminal` report it.
"""
