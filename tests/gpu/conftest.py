"""The GPU suite's pytest setup."""


def pytest_configure(config):
    # pytest-xdist's marker, registered where xdist is not installed (the suite run on the CPU).
    config.addinivalue_line("markers", "xdist_group(name): run these tests on one xdist worker")
