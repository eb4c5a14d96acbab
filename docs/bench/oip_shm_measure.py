"""What Triton's system shared-memory extension saves per request, against the real server (docs/oip.md).

Starts a server (one gateway) on a repository holding the orientation model and a tensor model that sums
a 1 MiB FP32 input, and times N sequential requests per way, each through tritonclient: the input sent in
the request (HTTP binary / gRPC raw) or placed in a registered region (shared memory).  Prints the median
and mean milliseconds per request and the difference.  Run from the repository root:

    .venv/bin/python docs/bench/oip_shm_measure.py [N]
"""
from __future__ import annotations

import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as tg
import tritonclient.http as th
from onnx import TensorProto, helper
from PIL import Image
from tritonclient.utils import serialize_byte_tensor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from tests.conftest import MODELS, ServerProcess, save_tensor_model  # noqa: E402
from tests.tritonshm import shm  # noqa: E402

ELEMS = 1 << 18  # 262144 FP32: 1 MiB


def repository(root: str) -> str:
    repo = os.path.join(root, "repo")
    os.makedirs(repo)
    os.symlink(os.path.join(MODELS, "orientation"), os.path.join(repo, "orientation"))
    graph = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["y"], keepdims=1)], "sum1m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", ELEMS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])])
    save_tensor_model(Path(repo), "sum1m", graph)
    return repo


def image_1mb() -> bytes:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (600, 580, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def timed(calls, n: int) -> list[list[float]]:
    """Milliseconds per request of each call, interleaved (a burst of load hits both alike)."""
    for call in calls:
        call()  # warm
    out: list[list[float]] = [[] for _ in calls]
    for _ in range(n):
        for call, times in zip(calls, out):
            t0 = time.perf_counter()
            call()
            times.append((time.perf_counter() - t0) * 1000)
    return out


def main(n: int) -> None:
    png = image_1mb()
    tensor = np.random.default_rng(1).random(ELEMS, dtype=np.float32)
    print(f"image {len(png)} bytes, tensor {tensor.nbytes} bytes, {n} requests each, load {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        srv = ServerProcess(tmp, AIENG_MODEL_REPOSITORY=repository(tmp), AIENG_PREPROCESS_WORKERS="1",
                            AIENG_POSTPROCESS_WORKERS="1").start()
        try:
            run(srv, png, tensor, n)
        finally:
            srv.proc.terminate()
            srv.proc.wait(30)


def run(srv, png: bytes, tensor: np.ndarray, n: int) -> None:
    ser = serialize_byte_tensor(np.array([png], dtype=object))
    key = f"/oip-shm-measure-{os.getpid()}"
    handle = shm.create_shared_memory_region("in", key, len(ser.item()) + tensor.nbytes)
    shm.set_shared_memory_region(handle, [ser])
    shm.set_shared_memory_region(handle, [tensor], offset=len(ser.item()))
    try:
        for mod, client in ((th, th.InferenceServerClient(srv.oip_http)),
                            (tg, tg.InferenceServerClient(srv.oip_grpc))):
            client.register_system_shared_memory("in", key, len(ser.item()) + tensor.nbytes)
            img_plain, img_shm = mod.InferInput("image", [1], "BYTES"), mod.InferInput("image", [1], "BYTES")
            img_plain.set_data_from_numpy(np.array([png], dtype=object))
            img_shm.set_shared_memory("in", len(ser.item()))
            x_plain, x_shm = mod.InferInput("x", [ELEMS], "FP32"), mod.InferInput("x", [ELEMS], "FP32")
            x_plain.set_data_from_numpy(tensor)
            x_shm.set_shared_memory("in", tensor.nbytes, len(ser.item()))
            want = client.infer("sum1m", [x_plain]).as_numpy("y")
            assert np.allclose(client.infer("sum1m", [x_shm]).as_numpy("y"), want)
            for model, plain, by_shm in (("orientation", img_plain, img_shm), ("sum1m", x_plain, x_shm)):
                a, b = timed([lambda: client.infer(model, [plain]), lambda: client.infer(model, [by_shm])], n)
                name = "http" if mod is th else "grpc"
                ma, mb = statistics.median(a), statistics.median(b)
                print(f"{name:4} {model:11} plain median {ma:6.2f} mean {statistics.mean(a):6.2f}"
                      f" | shm median {mb:6.2f} mean {statistics.mean(b):6.2f} | saved {ma - mb:5.2f} ms")
            client.unregister_system_shared_memory()
            client.close()
    finally:
        shm.destroy_shared_memory_region(handle)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
