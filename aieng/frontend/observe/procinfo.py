"""Process and GPU facts for metrics and /debug: resident memory per process (psutil)
and GPU memory/utilisation (NVML, only where a GPU is present)."""
from __future__ import annotations

from aieng.wire.records import ProcessState


def process_memory(processes: dict[str, ProcessState]) -> dict[tuple[str, str], float]:
    """``{(role, worker): rss bytes}`` for the supervisor's process table."""
    import psutil

    out = {}
    for name, proc in processes.items():
        try:
            out[(proc.role, name)] = float(psutil.Process(proc.pid).memory_info().rss)
        except (psutil.Error, TypeError, ValueError):
            pass
    return out


def gpu_usage() -> dict[int, tuple[float, float]]:
    """``{gpu index: (memory used bytes, utilisation 0-1)}``; empty when NVML is not usable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            out = {}
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                out[i] = (float(pynvml.nvmlDeviceGetMemoryInfo(h).used),
                          pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
            return out
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return {}
