"""The generated completion scripts parse in their own shells (bash, zsh, fish: each one's no-exec
mode, where it is installed)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from memstaged.cli.generate import DATA, FILES


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_scripts_parse(shell: str) -> None:
    """Each script is valid for its shell (checked with the shell's own no-exec mode where
    that shell is installed)."""
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed: its script cannot be parsed here")
    flag = "--no-execute" if shell == "fish" else "-n"
    result = subprocess.run(
        [shell, flag, str(DATA / FILES[shell])], capture_output=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
