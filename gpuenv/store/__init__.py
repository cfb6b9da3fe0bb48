"""gpuenv's cache directory and the wheel store in it.

- `cache`: the directory, small atomic JSON records, a file's digest for cache keys;
- `wheelhouse`: the content-addressed wheel store (index pages, wheel choice, prune,
  export and import);
- `fetch`: the client's fetches into the store (pages, wheels, uv), online or offline;
- `credentials` (netrc, environment) and `ca` (the CA bundle gpuenv's own fetches trust).
"""
