"""The project a user hands gpuenv: a matrix file, its resolution and its lock, read once.

- `project` opens the matrix (`-f`, $GPUENV_MATRIX, ./matrix.yaml), resolves it against the
  catalog and reads its lock; every verb that works from a matrix starts there;
- `lockfile` is matrix.lock, the file: its format, and whether it still matches the matrix
  and the engine's bases (resolving it is gpuenv/building/lock.py);
- `init` writes a first matrix.yaml for a project directory (`gpuenv init`);
- `snapshot` keeps a resolved project between commands, keyed by `fingerprint` (the
  matrix, its lock, the catalog, the templates and gpuenv's own code).
"""
