"""Process and GPU facts for metrics, /debug and the status page: resident memory per process (psutil),
CPU per process (``CpuUsage``: psutil's share since the previous sample, so it keeps each process's
handle between samples) and GPU memory/utilisation (NVML, only where a GPU is present)."""
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


class CpuUsage:
    def __init__(self) -> None:
        self.handles: dict[int, object] = {}  # pid -> psutil.Process (its last CPU times)

    def sample(self, processes: dict[str, ProcessState]) -> dict[str, float]:
        """``{worker: CPU percent of one core}`` since the previous sample (a process seen for the first
        time is left out until the next); handles of processes gone are dropped."""
        import psutil

        out, kept = {}, {}
        for name, proc in processes.items():
            if not isinstance(proc.pid, int):
                continue
            handle = self.handles.get(proc.pid)
            try:
                if handle is None:
                    handle = psutil.Process(proc.pid)
                    handle.cpu_percent(None)  # the first call only starts the count
                else:
                    out[name] = float(handle.cpu_percent(None))
                kept[proc.pid] = handle
            except psutil.Error:
                pass
        self.handles = kept
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
