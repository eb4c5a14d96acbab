"""Unit tests for aieng/config.py and aieng/envs.py: one typed configuration."""
from __future__ import annotations

import dataclasses
import os

import pytest

from aieng import envs
from aieng.config import INTERNAL, Config, load_config


@pytest.fixture
def cpus(monkeypatch):
    """Pretend this process may run on ``n`` CPUs (affinity, not the machine's count)."""
    def set_cpus(n: int) -> None:
        monkeypatch.setattr(envs.os, "sched_getaffinity", lambda pid: set(range(n)))
    set_cpus(8)
    return set_cpus


def write_yaml(tmp_path, text: str) -> str:
    path = tmp_path / "aieng.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


# ------------------------------------------------------------ registry
def test_registry_covers_every_config_field():
    fields = {f.name for f in dataclasses.fields(Config)} - set(INTERNAL)
    assert {v.field for v in envs.REGISTRY} == fields
    assert not {v.field for v in envs.REGISTRY} & set(INTERNAL), "internal fields are never read from the env"
    assert len({v.field for v in envs.REGISTRY}) == len(envs.REGISTRY), "one variable per field"
    assert all(v.name.startswith("AIENG_") and v.help for v in envs.REGISTRY)
    assert all(v.name == "AIENG_" + v.field.upper() for v in envs.REGISTRY)


def test_registry_defaults_match_config_defaults(cpus):
    defaults = Config()
    for v in envs.REGISTRY:
        if not callable(v.default):
            assert v.default_value() == getattr(defaults, v.field), v.name
            assert isinstance(v.default_value(), bool if v.type is envs.boolean else v.type), v.name


def test_markdown_table_lists_every_variable():
    table = envs.markdown_table()
    for v in envs.REGISTRY:
        assert f"`{v.name}`" in table
    assert table.count("\n") == len(envs.REGISTRY) + 1


# ------------------------------------------------------------ precedence
def test_defaults_only(cpus):
    cfg = load_config(environ={})
    assert set(cfg.sources.values()) == {"default"}
    assert set(cfg.sources) == {v.field for v in envs.REGISTRY}
    assert cfg.frontend_addr == "tcp://127.0.0.1:5555" and cfg.max_inflight == 256
    assert cfg.instance == ""


def test_precedence_defaults_yaml_env_flags(tmp_path, cpus):
    path = write_yaml(tmp_path, "max_inflight: 100\nlog_level: DEBUG\ndevice: cuda\nmax_wait_ms: 3.5\n")
    environ = {"AIENG_MAX_INFLIGHT": "200", "AIENG_DEVICE": "cpu", "AIENG_SHM_SLOTS": "12",
               "PATH": "/bin", "HOME": "/root"}  # non-AIENG variables are not ours
    flags = {"max_inflight": 300, "log_level": None, "shm_slots": None, "drain_grace_s": 2.5}
    cfg = load_config(path, flags=flags, environ=environ)

    assert (cfg.max_inflight, cfg.sources["max_inflight"]) == (300, "flag")  # flag > env > yaml
    assert (cfg.device, cfg.sources["device"]) == ("cpu", "env:AIENG_DEVICE")  # env > yaml
    assert (cfg.shm_slots, cfg.sources["shm_slots"]) == (12, "env:AIENG_SHM_SLOTS")  # None flag ignored
    assert (cfg.log_level, cfg.sources["log_level"]) == ("DEBUG", f"file:{path}")  # None flag ignored
    assert (cfg.max_wait_ms, cfg.sources["max_wait_ms"]) == (3.5, f"file:{path}")
    assert (cfg.drain_grace_s, cfg.sources["drain_grace_s"]) == (2.5, "flag")
    assert (cfg.frontend_addr, cfg.sources["frontend_addr"]) == ("tcp://127.0.0.1:5555", "default")
    assert cfg.ring_slots == 12


def test_env_values_are_typed(cpus):
    cfg = load_config(environ={"AIENG_MAX_WAIT_MS": "2", "AIENG_PREPROCESS_WORKERS": "3",
                               "AIENG_MODELS": "minilm,tabular", "AIENG_RUNTIME_DIR": ""})
    assert cfg.max_wait_ms == 2.0 and isinstance(cfg.max_wait_ms, float)
    assert cfg.preprocess_workers == 3 and isinstance(cfg.preprocess_workers, int)
    assert cfg.models == "minilm,tabular"
    assert cfg.sources["runtime_dir"] == "env:AIENG_RUNTIME_DIR"


def test_environ_defaults_to_os_environ(monkeypatch, cpus):
    for key in [k for k in os.environ if k.startswith("AIENG_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AIENG_MAX_INFLIGHT", "9")
    assert load_config().max_inflight == 9


@pytest.mark.parametrize("var, raw", [
    ("AIENG_MAX_INFLIGHT", "lots"),
    ("AIENG_MAX_INFLIGHT", "1.5"),
    ("AIENG_MAX_WAIT_MS", "soon"),
    ("AIENG_PREPROCESS_WORKERS", ""),
])
def test_invalid_env_value_names_the_variable(var, raw, cpus):
    with pytest.raises(ValueError, match=var):
        load_config(environ={var: raw})


def test_unknown_aieng_variable_raises(cpus):
    with pytest.raises(ValueError, match="AIENG_MAX_INFLIGT"):
        load_config(environ={"AIENG_MAX_INFLIGT": "10"})


# ------------------------------------------------------------ yaml
def test_yaml_unknown_or_reserved_keys_raise(tmp_path, cpus):
    for text in ("max_inflite: 3\n", "instance: '123'\n", "sources: {}\n"):
        with pytest.raises(ValueError, match="unknown setting"):
            load_config(write_yaml(tmp_path, text), environ={})


def test_yaml_top_level_must_be_mapping(tmp_path, cpus):
    with pytest.raises(ValueError, match="mapping"):
        load_config(write_yaml(tmp_path, "- a\n- b\n"), environ={})


def test_empty_yaml_is_fine(tmp_path, cpus):
    cfg = load_config(write_yaml(tmp_path, ""), environ={})
    assert set(cfg.sources.values()) == {"default"}


# ------------------------------------------------------------ validation
@pytest.mark.parametrize("flags, what", [
    ({"preprocess_workers": 0}, "preprocess_workers"),
    ({"postprocess_workers": -1}, "postprocess_workers"),
    ({"max_inflight": 0}, "max_inflight"),
    ({"max_message_bytes": 100}, "max_message_bytes"),
    ({"default_timeout_ms": 0}, "default_timeout_ms"),
    ({"default_timeout_ms": 5000, "max_timeout_ms": 1000}, "max_timeout_ms"),
    ({"shm_slot_bytes": 1024}, "shm_slot_bytes"),
    ({"shm_slots": -1}, "shm_slots"),
    ({"device": "tpu"}, "device"),
    ({"log_format": "xml"}, "log_format"),
    ({"intra_op_threads": -2}, "intra_op_threads"),
])
def test_invalid_combinations_raise(flags, what, cpus):
    with pytest.raises(ValueError, match=f"invalid configuration: {what}.*\\(from flag\\)"):
        load_config(flags=flags, environ={})


def test_invalid_value_names_its_source(tmp_path, cpus):
    with pytest.raises(ValueError, match=r"preprocess_workers.*\(from env:AIENG_PREPROCESS_WORKERS\)"):
        load_config(environ={"AIENG_PREPROCESS_WORKERS": "0"})
    path = write_yaml(tmp_path, "postprocess_workers: 0\n")
    with pytest.raises(ValueError, match=rf"postprocess_workers.*\(from file:{path}\)"):
        load_config(path, environ={})


def test_config_dict_round_trip(cpus):
    cfg = load_config(flags={"max_inflight": 17}, environ={})
    cfg = dataclasses.replace(cfg, instance="4242")
    again = Config.from_dict({**cfg.to_dict(), "not_a_field": 1})
    assert again == cfg
    assert again.ring_slots == 17


# ------------------------------------------------------------ worker counts
@pytest.mark.parametrize("ncpu, pre, post, lanes", [
    (1, 1, 1, 1), (2, 2, 1, 2), (3, 3, 1, 3), (4, 4, 1, 4), (6, 4, 1, 4), (8, 4, 2, 4), (16, 4, 2, 4),
    (128, 4, 2, 4),
])
def test_default_worker_counts_follow_affinity(ncpu, pre, post, lanes, cpus):
    cpus(ncpu)
    assert envs.cpu_count() == ncpu
    cfg = load_config(environ={})
    assert (cfg.preprocess_workers, cfg.postprocess_workers, cfg.executor_lanes) == (pre, post, lanes)
    assert cfg.sources["preprocess_workers"] == "default"


def test_explicit_worker_count_wins_over_affinity(cpus):
    cpus(1)
    cfg = load_config(environ={"AIENG_PREPROCESS_WORKERS": "3"}, flags={"postprocess_workers": 2})
    assert (cfg.preprocess_workers, cfg.postprocess_workers) == (3, 2)


def test_yaml_wrong_type_is_a_value_error(tmp_path, cpus):
    with pytest.raises(ValueError, match="preprocess_workers"):
        load_config(write_yaml(tmp_path, "preprocess_workers: '2'\n"), environ={})
