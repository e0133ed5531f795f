"""Server settings: one validation (server/config.py) for flags and TRANSLATOR_* variables; bad ones
exit 2 with one line naming the setting and the values it allows, before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from server.config import HELP, ServerConfig, build_parser, load_config
from tests.conftest import REPO_ROOT

# (flag, bad value, what the message must say is allowed)
BAD = [
    ("--device", "gpu", "auto, cpu, cuda or cuda:N"),
    ("--device", "cuda:x", "auto, cpu, cuda or cuda:N"),
    ("--log-level", "verbose", "DEBUG, INFO, WARNING, ERROR, CRITICAL (any case)"),
    ("--metrics-port", "-5", "0..65535 (0 = any free port) or -1 (no metrics endpoint)"),
    ("--metrics-port", "65536", "0..65535 (0 = any free port) or -1 (no metrics endpoint)"),
    ("--port", "-1", "0..65535 (0 = any free port)"),
    ("--port", "70000", "0..65535 (0 = any free port)"),
    ("--threads", "-3", ">= 0 (0 = one per physical core)"),
    ("--http-port", "70000", "0..65535 (0 = no HTTP API)"),
    ("--max-running-rows", "-1", ">= 0 (0 = auto)"),
    ("--shutdown-grace-s", "-1", "a finite number >= 0"),
    ("--shutdown-grace-s", "nan", "a finite number >= 0"),
    ("--drain-delay-s", "-0.5", "a finite number >= 0"),
    ("--max-wait-ms", "-1", "a finite number >= 0"),
    ("--variant", "fp16", "fp32 or int8"),
    ("--batching-mode", "always", "request, inflight, off"),
]


def _env_name(flag: str) -> str:
    return "TRANSLATOR_" + flag.removeprefix("--").replace("-", "_").upper()


@pytest.mark.parametrize(("flag", "value", "allowed"), BAD)
def test_bad_flag_and_variable_get_the_same_message(flag, value, allowed):
    messages = []
    for argv, env in (([f"{flag}={value}"], {}), ([], {_env_name(flag): value})):
        with pytest.raises(ValueError) as e:
            load_config(argv, env)
        message = str(e.value)
        assert "\n" not in message
        assert f"must be {allowed}, got " in message and value in message
        assert flag in message and _env_name(flag) in message  # names both spellings
        messages.append(message)
    assert messages[0] == messages[1]  # one validation


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--device", "CUDA:1", "--log-level", "debug"], {"device": "cuda:1", "log_level": "DEBUG"}),
        (["--device", "Auto", "--log-level", "Warning"], {"device": "auto", "log_level": "WARNING"}),
        (["--metrics-port", "-1", "--port", "0"], {"metrics_port": -1, "port": 0}),
        (["--metrics-port", "65535", "--port", "65535"], {"metrics_port": 65535, "port": 65535}),
        (["--threads", "0", "--shutdown-grace-s", "0", "--drain-delay-s", "0"], {"threads": 0}),
        (["--log-level", "critical", "--device", "cpu"], {"log_level": "CRITICAL", "device": "cpu"}),
        (
            ["--variant", "int8", "--batching-mode", "request"],
            {"variant": "int8", "batching_mode": "request"},
        ),
        (["--variant", "fp32", "--batching-mode", "off"], {"variant": "fp32", "batching_mode": "off"}),
    ],
)
def test_allowed_values_pass_and_are_normalised(argv, expected):
    config = load_config(argv, {})
    for name, value in expected.items():
        assert getattr(config, name) == value


def test_flag_wins_over_a_bad_variable_and_errors_are_listed_together():
    assert load_config(["--threads", "2"], {"TRANSLATOR_THREADS": "-3"}).threads == 2
    with pytest.raises(ValueError) as e:
        load_config(["--threads=-3"], {"TRANSLATOR_DEVICE": "gpu", "TRANSLATOR_LOG_LEVEL": "loud"})
    message = str(e.value)
    assert message.startswith("invalid configuration: ") and "\n" not in message
    assert all(
        name in message for name in ("TRANSLATOR_THREADS", "TRANSLATOR_DEVICE", "TRANSLATOR_LOG_LEVEL")
    )


def test_config_accepts_exactly_the_devices_the_engine_accepts():
    """server/config.py checks devices itself (a bad one must not wait for the model load): the same
    set as open_sessions, which raises ValueError for an unknown device (RuntimeError for a CUDA
    device this machine cannot honour, which is not a configuration error)."""
    from server.engine.sessions import open_sessions

    for device in ("auto", "cpu", "CPU", "cuda", "cuda:0", "CUDA:3", "gpu", "cuda:x", "cuda:", "", "tpu"):
        try:
            open_sessions({}, device, 1)
            engine_accepts = True
        except RuntimeError:
            engine_accepts = True
        except ValueError:
            engine_accepts = False
        try:
            ServerConfig(device=device).validate()
            config_accepts = True
        except ValueError:
            config_accepts = False
        assert config_accepts == engine_accepts, device


def test_cuda_tf32_reaches_the_cuda_provider_s_options():
    """TRANSLATOR_CUDA_TF32=false asks ONNX Runtime's CUDA provider for full fp32 (use_tf32=0); the
    default passes no option at all, so a build that predates it keeps working."""
    from server.engine.sessions import cuda_provider

    assert load_config([], {}).cuda_tf32 is True
    assert load_config([], {"TRANSLATOR_CUDA_TF32": "false"}).cuda_tf32 is False
    assert load_config(["--no-cuda-tf32"], {}).cuda_tf32 is False
    assert cuda_provider(1) == ("CUDAExecutionProvider", {"device_id": 1})
    assert cuda_provider(0, tf32=False) == ("CUDAExecutionProvider", {"device_id": 0, "use_tf32": "0"})


def test_help_says_what_the_code_does():
    assert "physical core" in HELP["threads"] and "ONNX Runtime default" not in HELP["threads"]
    assert "-1" in HELP["metrics_port"]
    text = build_parser({}).format_help()
    assert "TRANSLATOR_THREADS" in text and "CRITICAL" in text
    assert text.startswith("usage: python -m server ")
    assert "Every flag can also be set with the environment variable shown in brackets." in " ".join(
        text.split()
    )
    assert "[TRANSLATOR_MAX_TEXTS] (default: 64)" in " ".join(text.split())
    assert "--warmup, --no-warmup run a warm-up translation before reporting SERVING [TRANSLATOR_WARMUP]" in (
        " ".join(text.split())
    )  # boolean flags are explained too
    assert set(HELP) == set(ServerConfig.__dataclass_fields__)  # every setting explained


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--device", "gpu"], {}),
        (["--log-level", "verbose"], {}),
        ([], {"TRANSLATOR_METRICS_PORT": "-5"}),
        ([], {"TRANSLATOR_SHUTDOWN_GRACE_S": "-1"}),
        ([], {"TRANSLATOR_PORT": "http"}),
        (["--max-texts", "many"], {}),
        (["--no-such-flag"], {}),
    ],
)
def test_main_exits_2_with_one_line(argv, env, monkeypatch, capsys):
    from server.__main__ import main

    for name in list(ServerConfig.__dataclass_fields__):
        monkeypatch.delenv("TRANSLATOR_" + name.upper(), raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m server: invalid configuration: ")


def test_process_exits_2_before_loading_anything(tmp_path):
    """`python -m server --device gpu --threads -3`: exit 2, one line on stderr, no model load (the
    bundle dir does not even exist)."""
    proc = subprocess.run(
        [sys.executable, "-m", "server", "--device", "gpu", "--threads", "-3"],
        cwd=REPO_ROOT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("TRANSLATOR_")},
            "TRANSLATOR_MODEL_DIR": str(tmp_path / "missing"),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "auto, cpu, cuda or cuda:N, got 'gpu'" in lines[0] and "must be >= 0" in lines[0]
    assert proc.stdout == ""


# ---- precedence and parsing ---------------------------------------------------------------------------


def test_defaults_without_flags_or_variables():
    assert load_config([], {}) == ServerConfig()
    assert ServerConfig().effective_batching_mode == "inflight"


@pytest.mark.parametrize(
    ("field", "flag_value", "env_value", "default"),
    [
        ("port", "6001", "6002", 50051),
        ("host", "10.1.2.3", "10.9.9.9", "0.0.0.0"),
        ("max_wait_ms", "2.5", "7.5", 10.0),
        ("batching_mode", "off", "request", "inflight"),
        ("shutdown_grace_s", "1", "2", 30.0),
    ],
)
def test_flag_over_variable_over_default(field, flag_value, env_value, default):
    flag, var = "--" + field.replace("_", "-"), "TRANSLATOR_" + field.upper()
    kind = type(default)
    assert getattr(load_config([], {}), field) == default
    assert getattr(load_config([], {var: env_value}), field) == kind(env_value)
    assert getattr(load_config([flag, flag_value], {var: env_value}), field) == kind(flag_value)
    assert getattr(load_config([flag, flag_value], {}), field) == kind(flag_value)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        (" yes ", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("False", False),
        ("no", False),
        ("off", False),
        ("", False),
    ],
)
def test_boolean_variables(text, value):
    config = load_config([], {"TRANSLATOR_WARMUP": text, "TRANSLATOR_BATCHING": text})
    assert (config.warmup, config.batching) == (value, value)
    assert config.effective_batching_mode == ("inflight" if value else "off")


def test_boolean_flags_win_over_variables():
    env = {"TRANSLATOR_WARMUP": "false", "TRANSLATOR_BATCHING": "true"}
    config = load_config(["--warmup", "--no-batching"], env)
    assert (config.warmup, config.batching, config.effective_batching_mode) == (True, False, "off")


@pytest.mark.parametrize(
    ("var", "value", "allowed"),
    [
        ("TRANSLATOR_WARMUP", "maybe", "true/false, 1/0, yes/no or on/off"),
        ("TRANSLATOR_BATCHING", "2", "true/false, 1/0, yes/no or on/off"),
        ("TRANSLATOR_PORT", "http", "an integer"),
        ("TRANSLATOR_THREADS", "1.5", "an integer"),
        ("TRANSLATOR_MAX_WAIT_MS", "x", "a number"),
    ],
)
def test_unparsable_flag_and_variable_get_the_same_one_line_message(var, value, allowed):
    name = var.removeprefix("TRANSLATOR_").lower()
    flag = "--" + name.replace("_", "-")
    expected = f"invalid configuration: {name} ({flag} / {var}) must be {allowed}, got {value!r}"
    with pytest.raises(ValueError) as e:
        load_config([], {var: value})
    assert str(e.value) == expected
    if "true/false" not in allowed:  # boolean flags take no value
        with pytest.raises(ValueError) as e:
            load_config([flag, value], {})
        assert str(e.value) == expected
        assert getattr(load_config([flag, "7"], {var: value}), name) == 7  # the flag wins


def test_unparsable_settings_are_listed_together():
    with pytest.raises(ValueError) as e:
        load_config(["--port=1.5"], {"TRANSLATOR_WARMUP": "maybe", "TRANSLATOR_THREADS": "-1"})
    assert str(e.value) == (
        "invalid configuration: port (--port / TRANSLATOR_PORT) must be an integer, got '1.5'; "
        "warmup (--warmup / TRANSLATOR_WARMUP) must be true/false, 1/0, yes/no or on/off, got 'maybe'"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--port"], "argument --port: expected one argument"),
        (["--warmup=yes"], "argument --warmup/--no-warmup: ignored explicit argument 'yes'"),
    ],
)
def test_a_bad_command_line_is_one_line_too(argv, expected):
    with pytest.raises(ValueError) as e:
        load_config(argv, {})
    assert str(e.value) == f"invalid configuration: {expected} (python -m server --help lists the flags)"


@pytest.mark.parametrize(
    ("name", "bad", "good"),
    [
        ("max_batch_tokens", 0, 1),
        ("max_batch_segments", 0, 1),
        ("max_running_tokens", 0, 1),
        ("max_queue_segments", 0, 1),
        ("max_texts", 0, 1),
        ("max_message_bytes", 0, 1),
        ("max_stream_inflight", 0, 1),
        ("max_admit_wait_steps", -1, 0),
        ("max_running_rows", -1, 0),
        ("threads", -1, 0),
        ("max_wait_ms", -0.001, 0.0),
        ("drain_delay_s", float("inf"), 0.0),
        ("shutdown_grace_s", float("-inf"), 0.0),
    ],
)
def test_each_bound_is_exact(name, bad, good):
    ServerConfig(**{name: good, "max_texts": 1} if name != "max_texts" else {name: good}).validate()
    with pytest.raises(ValueError) as e:
        ServerConfig(**{name: bad}).validate()
    assert str(e.value).startswith(f"invalid configuration: {name} (--{name.replace('_', '-')} / ")
    assert f", got {bad!r}" in str(e.value)  # the value the operator gave


def test_cross_setting_checks():
    with pytest.raises(
        ValueError, match=r"max_texts \(--max-texts / TRANSLATOR_MAX_TEXTS\) \(9\) must not exceed"
    ):
        ServerConfig(max_texts=9, max_queue_segments=8).validate()
    ServerConfig(max_texts=8, max_queue_segments=8).validate()
    with pytest.raises(ValueError, match="TLS needs both a certificate"):
        ServerConfig(tls_cert=__file__).validate()
    with pytest.raises(ValueError, match="TLS needs both a certificate"):
        ServerConfig(tls_key=__file__).validate()
    with pytest.raises(ValueError, match="TRANSLATOR_TLS_CLIENT_CA\\) needs TLS cert and key"):
        ServerConfig(tls_client_ca=__file__).validate()
    with pytest.raises(
        ValueError, match="tls_key \\(--tls-key / TRANSLATOR_TLS_KEY\\): no such file '/nope'"
    ):
        ServerConfig(tls_cert=__file__, tls_key="/nope").validate()
    config = ServerConfig(tls_cert=__file__, tls_key=__file__, tls_client_ca=__file__)
    config.validate()
    assert config.tls_enabled and not ServerConfig().tls_enabled


def test_process_exits_2_for_an_unparsable_variable(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "server"],
        cwd=REPO_ROOT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("TRANSLATOR_")},
            "TRANSLATOR_WARMUP": "sometimes",
            "TRANSLATOR_MODEL_DIR": str(tmp_path / "missing"),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "python -m server: invalid configuration: warmup (--warmup / TRANSLATOR_WARMUP) must be "
        "true/false, 1/0, yes/no or on/off, got 'sometimes'\n"
    )
