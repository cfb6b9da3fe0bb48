"""`gpuenv validate`: prove what an image holds, with pytest-testinfra suites run against a
container of it. The suites live in suites/ (shipped in the package); expected.py says what
each image must hold; runner.py starts the containers, runs pytest and summarises."""
