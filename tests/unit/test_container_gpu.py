"""deploy/Dockerfile.gpu: hadolint passes, and what it states agrees with the CPU image and the package.

It adds to the CPU image the `gpu` extra (onnxruntime-gpu[cuda,cudnn]) at the pinned onnxruntime-gpu;
its LD_LIBRARY_PATH names exactly the directories under the image's site-packages where the installed
onnxruntime-gpu's own preload list looks for CUDA and cuDNN (so a new CUDA major in a new pin fails here,
not on a GPU host); it ends as the CPU image's user, with AIENG_DEVICE=cuda.
"""
import os
import re
import subprocess
import tomllib

import onnxruntime

from aieng.config import load_config
from tests.conftest import ROOT
from tests.dockerfile import env_of, hadolint, instructions

GPU = os.path.join(ROOT, "deploy", "Dockerfile.gpu")
TEXT = open(GPU, encoding="utf-8").read()
CPU_TEXT = open(os.path.join(ROOT, "deploy", "Dockerfile"), encoding="utf-8").read()
INSTRUCTIONS = instructions(GPU)


def env() -> dict[str, str]:
    return env_of(INSTRUCTIONS)


def test_hadolint_passes():
    r = subprocess.run([hadolint(), GPU], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_it_builds_on_the_cpu_image_its_header_tells_how_to_build():
    (arg,) = [x for x in INSTRUCTIONS if x.startswith("ARG BASE_IMAGE=")]
    tag = arg.split("=", 1)[1]
    assert [x for x in INSTRUCTIONS if x.startswith("FROM ")] == ["FROM ${BASE_IMAGE}"]
    assert f"docker build -f deploy/Dockerfile -t {tag} ." in TEXT
    assert "docker build -f deploy/Dockerfile.gpu -t aieng:gpu ." in TEXT


def test_it_installs_the_gpu_extra_at_the_pinned_onnxruntime_gpu():
    project = tomllib.loads(open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8").read())["project"]
    (extra,) = project["optional-dependencies"]["gpu"]
    (run,) = [x for x in INSTRUCTIONS if x.startswith("RUN ")]
    assert "COPY constraints.txt /tmp/constraints.txt" in INSTRUCTIONS
    assert re.search(r"/opt/aieng/bin/python -m pip install --no-cache-dir -c /tmp/constraints.txt "
                     r"\"onnxruntime-gpu\[cuda,cudnn\]\"", run)
    assert extra.startswith("onnxruntime-gpu[cuda,cudnn]")
    pins = open(os.path.join(ROOT, "constraints.txt"), encoding="utf-8").read().splitlines()
    assert f"onnxruntime-gpu=={onnxruntime.__version__}" in pins


def test_library_path_is_where_onnxruntime_looks_for_cuda_and_cudnn():
    (python,) = re.findall(r"^ARG PYTHON_IMAGE=python:(\d+\.\d+)-", CPU_TEXT, re.M)
    site = f"/opt/aieng/lib/python{python}/site-packages"
    wanted = {os.path.join(site, *path[:-1])
              for path in onnxruntime._get_nvidia_dll_paths(False, cuda=True, cudnn=True)}
    assert set(env()["LD_LIBRARY_PATH"].split(":")) == wanted


def test_it_ends_as_the_cpu_images_user_and_insists_on_cuda():
    (cpu_user,) = re.findall(r"^USER (\S+)$", CPU_TEXT, re.M)
    users = [x.split()[1] for x in INSTRUCTIONS if x.startswith("USER ")]
    assert users[-1] == cpu_user and users[0] == "0"
    e = env()
    assert load_config(environ={"AIENG_DEVICE": e["AIENG_DEVICE"]}).device == "cuda"
    assert e["NVIDIA_VISIBLE_DEVICES"] == "all" and "compute" in e["NVIDIA_DRIVER_CAPABILITIES"].split(",")
