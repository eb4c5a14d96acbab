"""One OIP client flooding the gRPC door, for the sharing tests: from a thread of its own, 64 requests of
32 rows of ``tabular`` in flight at a time, bounded in time (60 s) and in count (20,000 answers), each
outcome kept as ``(grpc code name, message)``.  ``channel`` makes its channel (plain or TLS); ``metadata``
goes with each call (an API key).  ``bites()`` waits (bounded) for its first refusal; leaving the ``with``
stops it.  ``one_at_a_time`` is the other client beside it: forty one-row requests through tritonclient."""
from __future__ import annotations

import threading
import time
from typing import Callable

import grpc
import tritonclient.grpc as tg
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

from tests.e2e.tabular_oip import http_input
from tests.waits import until

SHARE_REFUSAL = "rows in flight at this gateway"  # the gateway's per-client row budget, in its refusal


def one_at_a_time(client, n: int = 40, **kw) -> list[str]:
    """``n`` one-row ``tabular`` requests (ids b0, b1, ...) through the tritonclient gRPC ``client``, each
    after the last; the answers' ids, in order.  ``kw`` goes with each call (``headers``); closes it."""
    try:
        return [client.infer("tabular", [http_input(tg, 40.0 + i)], request_id=f"b{i}", client_timeout=30,
                             **kw).get_response().id for i in range(n)]
    finally:
        client.close()


def wide_request(rows: int) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="tabular")
    t = req.inputs.add(name="bill_length_mm", datatype="FP32", shape=[rows])
    t.contents.fp32_contents.extend([40.0] * rows)
    return req


class GrpcFlood:
    def __init__(self, channel: Callable[[], grpc.Channel], metadata: tuple = ()):
        self.channel, self.metadata = channel, metadata
        self.outcomes: list[tuple[str, str]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        with self.channel() as ch:
            stub = pbg.GRPCInferenceServiceStub(ch)
            end = time.monotonic() + 60
            while not self.stop.is_set() and time.monotonic() < end and len(self.outcomes) < 20000:
                calls = [stub.ModelInfer.future(wide_request(32), timeout=30, metadata=self.metadata)
                         for _ in range(64)]
                for call in calls:
                    try:
                        call.result()
                        self.outcomes.append(("OK", ""))
                    except grpc.RpcError as exc:
                        self.outcomes.append((exc.code().name, exc.details() or ""))

    def bites(self, timeout_s: float = 30) -> bool:
        return until(lambda: any(code == "UNAVAILABLE" for code, _ in self.outcomes), timeout_s, 0.05)

    def refused(self) -> list[str]:
        return [msg for code, msg in self.outcomes if code == "UNAVAILABLE"]

    def refused_for_its_share(self) -> bool:
        """Refused at least once, and every refusal names this client's share of the gateway's rows."""
        refused = self.refused()
        return bool(refused) and all("this client has" in msg and SHARE_REFUSAL in msg for msg in refused)

    def __enter__(self) -> GrpcFlood:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(90)
