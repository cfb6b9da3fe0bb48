"""What the integration tests share, in one place: names (cells), running the CLI (cli),
the engine (engine, dockerd) and cleaning up after the session (cleanup).

conftest.py and the *_fixtures.py plugins import from here; test modules take fixtures by
name and import constants from their fixture module. tests/integration is on sys.path
(pytest's default rootdir-relative "prepend" import mode puts a conftest's directory there
before importing it), so this package is ``support`` and is imported once, under that name.
"""
