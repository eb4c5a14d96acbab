"""The deployment files the docs point to exist and parse."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_unit_file_points_to_files_that_exist():
    with open(os.path.join(ROOT, "deploy", "aieng.service"), encoding="utf-8") as fh:
        header = fh.readline()
    for path in ("docs/operations.md", "deploy/install.sh"):
        assert path in header
        assert os.path.isfile(os.path.join(ROOT, path)), path


def test_install_script_is_valid_bash():
    """Only its syntax: run for real (as root, as CI runs) it would install a system service."""
    script = os.path.join(ROOT, "deploy", "install.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    assert os.access(script, os.X_OK)
