"""The compatibility catalog: which framework releases, Pythons, CUDA and cuDNN go together.

- `compat`: the catalog (`gpuenv/data/*.yaml`) and the resolution of the matrix's axes into
  cells, with the reason for every combination it rejects;
- `index`: package indexes' pages (PEP 691/503) and wheels' METADATA;
- `refresh`: the catalog's files generated from those (`gpuenv catalog --refresh`);
- `listing`: what `gpuenv catalog` prints.
"""
