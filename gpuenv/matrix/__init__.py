"""What a user asks for and what an image promises, as plain data (no I/O but reading
input files).

- `schema`: matrix.yaml's schema, axes and cells (file:line errors); `requirements` reads
  the users' requirements files as pip does, `userlock` their `uv.lock` or `pylock.toml`,
  `index_url` checks an index URL wherever one is written; `yamlfile` and `files` read
  input files safely, `umask` reads the process's umask;
- `cell`: one cell of the matrix, everything the templates need;
- `contract`: the image contract (labels, layout) that every other part reads;
- `errors`: `GpuenvError`, the one error a user sees (one line, an exit code).
"""
