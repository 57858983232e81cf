"""The suite's plugins; pyproject.toml's ``pythonpath`` puts the repository root (flows/, tasks/,
blocks/, testkit/) and tests/ (the helpers beside the tests) on sys.path."""

pytest_plugins = ["plugins.environment", "plugins.distribution", "plugins.services"]
