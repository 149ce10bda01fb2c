import pytest

pytest.importorskip("pyarrow", reason="needs the dataset extra: pip install -e '.[dataset]'")


@pytest.fixture(scope="session")
def lerobot():
    """The python of LeRobot's own venv (made once, cached: tests/base_venv.py)."""
    from tests.base_venv import lerobot_python

    return lerobot_python()
