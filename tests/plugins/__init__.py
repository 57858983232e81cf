"""pytest plugins of this suite (registered by tests/conftest.py): how tests are spread over
pytest-xdist workers, the environment each test gets, and the services started once."""
