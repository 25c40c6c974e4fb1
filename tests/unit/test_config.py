"""Tests for mservd.config: one precedence order for server and per-model settings."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from mservd import config
from mservd.config import ConfigError, ModelSettings, Settings

REPO_ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.properties"
    path.write_text(text, encoding="utf-8")
    return path


# --- defaults ------------------------------------------------------------------------------


def test_load_without_file_gives_secure_defaults() -> None:
    s = config.load(env={})
    assert s.inference_address == "http://127.0.0.1:8080"
    assert s.management_address == "http://127.0.0.1:8081"
    assert s.metrics_address == "http://127.0.0.1:8082"
    assert (s.grpc_inference_port, s.grpc_management_port) == (7070, 7071)
    assert s.model_store is None
    assert s.load_models == ()
    assert s.default_workers_per_model == 0
    assert s.job_queue_size == 100
    assert s.default_response_timeout == 120
    assert s.default_startup_timeout == 120
    assert s.max_request_size == s.max_response_size == 6553500
    assert s.number_of_gpu is None
    assert (s.batch_size, s.max_batch_delay) == (1, 100)
    assert s.enable_model_api is False
    assert s.disable_token_authorization is False
    assert s.enable_envvars_config is False
    assert s.token_expiration_min == 60.0
    assert s.allowed_urls == ()
    assert s.metrics_mode == "prometheus"
    assert s.snapshot is True
    assert s.max_archive_bytes == 4 * 1024**3
    assert (s.log_level, s.log_format) == ("INFO", "plain")
    assert s.models == {}
    assert s.extra == {}
    assert s.config_file is None


def test_load_with_no_arguments_matches_settings_defaults() -> None:
    assert config.load(env={}) == Settings()


def test_settings_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.load(env={}).job_queue_size = 5  # type: ignore[misc]


def test_settings_fields_declare_key_and_doc() -> None:
    for f in dataclasses.fields(Settings):
        if f.name in ("extra", "config_file"):
            continue
        assert f.metadata["key"], f.name
        assert f.metadata["doc"], f.name


def test_describe_settings_lists_every_key_with_default() -> None:
    rows = {key: (default, doc) for key, default, doc in config.describe_settings()}
    assert rows["job_queue_size"][0] == "100"
    assert rows["enable_snapshot"][0] == "true"
    assert rows["number_of_gpu"][0] == ""
    assert "extra" not in rows and "config_file" not in rows
    assert all(doc for _, doc in rows.values())


# --- config.properties parsing ---------------------------------------------------------------


def test_parse_properties_reads_separators_and_skips_comments() -> None:
    text = (
        "# a comment\n"
        "! another comment\n"
        "\n"
        "  job_queue_size = 5  \n"
        "model_store: /srv/models\n"
        "log_dir logs2\n"
        "inference_address=http://0.0.0.0:9000\n"
        "empty=\n"
    )
    assert config.parse_properties(text) == {
        "job_queue_size": "5",
        "model_store": "/srv/models",
        "log_dir": "logs2",
        "inference_address": "http://0.0.0.0:9000",
        "empty": "",
    }


def test_parse_properties_joins_continuation_lines() -> None:
    text = (
        "models={\\\n"
        '  "m": {\\\n'
        '    "1.0": {"defaultVersion": true, "marName": "m.mar", "batchSize": 4}\\\n'
        "  }\\\n"
        "}\n"
        "job_queue_size=7\n"
    )
    props = config.parse_properties(text)
    assert json.loads(props["models"]) == {
        "m": {"1.0": {"defaultVersion": True, "marName": "m.mar", "batchSize": 4}}
    }
    assert props["job_queue_size"] == "7"


def test_parse_properties_forgives_whitespace_after_backslash() -> None:
    assert config.parse_properties("a=1,\\  \n  2\nb=3\n") == {"a": "1,2", "b": "3"}


def test_parse_properties_comment_lines_do_not_continue() -> None:
    props = config.parse_properties("# models={\\\nbatch_size=3\n")
    assert props == {"batch_size": "3"}


def test_parse_properties_decodes_java_escapes_and_last_key_wins() -> None:
    props = config.parse_properties("a=x\\\\.y\nb=1\nb=2\nc=tab\\there\n")
    assert props == {"a": "x\\.y", "b": "2", "c": "tab\there"}


def test_load_reads_file_and_keeps_unknown_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(
        tmp_path,
        "job_queue_size=5\n"
        "load_models=a.mar, b.mar\n"
        "allowed_urls=https://s3.amazonaws.com/.*,https://example\\\\.com/.*\n"
        "number_of_gpu=2\n"
        "enable_model_api=TRUE\n"
        "vmargs=-Xmx4g\n"
        "async_logging=true\n",
    )
    with caplog.at_level(logging.DEBUG, logger="mservd.config"):
        s = config.load(path, env={})
    assert s.job_queue_size == 5
    assert s.load_models == ("a.mar", "b.mar")
    assert s.allowed_urls == ("https://s3.amazonaws.com/.*", r"https://example\.com/.*")
    assert s.number_of_gpu == 2
    assert s.enable_model_api is True
    assert dict(s.extra) == {"vmargs": "-Xmx4g", "async_logging": "true"}
    assert s.config_file == str(path)
    assert "async_logging" in caplog.text


def test_load_parses_multiline_models_block(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "models={\\\n"
        '  "noop": {\\\n'
        '    "1.0": {"defaultVersion": true, "marName": "noop.mar", "minWorkers": 1,\\\n'
        '            "maxWorkers": 1, "batchSize": 4, "maxBatchDelay": 100,\\\n'
        '            "responseTimeout": 120}\\\n'
        "  }\\\n"
        "}\n",
    )
    s = config.load(path, env={})
    assert s.models["noop"]["1.0"]["marName"] == "noop.mar"
    assert s.models["noop"]["1.0"]["batchSize"] == 4


@pytest.mark.parametrize("value", ["standalone", "", "Standalone"])
def test_load_models_standalone_or_empty_loads_none(tmp_path: Path, value: str) -> None:
    s = config.load(write(tmp_path, f"load_models={value}\n"), env={})
    assert s.load_models == ()


def test_load_models_keeps_all_and_named_items(tmp_path: Path) -> None:
    assert config.load(write(tmp_path, "load_models=all\n"), env={}).load_models == ("all",)
    s = config.load(write(tmp_path, "load_models=res=resnet.mar,bert.mar\n"), env={})
    assert s.load_models == ("res=resnet.mar", "bert.mar")


def test_load_empty_optional_value_means_unset(tmp_path: Path) -> None:
    s = config.load(write(tmp_path, "number_of_gpu=\nmodel_store=\n"), env={})
    assert s.number_of_gpu is None
    assert s.model_store is None


def test_load_normalises_case_of_choices(tmp_path: Path) -> None:
    s = config.load(write(tmp_path, "log_level=debug\nmetrics_mode=LOG\n"), env={})
    assert (s.log_level, s.metrics_mode) == ("DEBUG", "log")


def test_load_accepts_port_zero_and_ipv6(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "inference_address=http://127.0.0.1:0\nmanagement_address=https://[::1]:8443\n",
    )
    s = config.load(path, env={})
    assert config.parse_address(s.inference_address) == ("http", "127.0.0.1", 0)
    assert config.parse_address(s.management_address) == ("https", "::1", 8443)


def test_load_missing_named_file_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.properties"
    with pytest.raises(ConfigError) as info:
        config.load(missing, env={})
    assert info.value.problems == [f"config file {str(missing)!r} does not exist"]


def test_repository_config_properties_loads() -> None:
    path = REPO_ROOT / "config.properties"
    s = config.load(path, env={})
    assert s.model_store == "model_store"
    assert s.inference_address == "http://127.0.0.1:8080"
    assert s.management_address == "http://127.0.0.1:8081"
    assert s.metrics_address == "http://127.0.0.1:8082"
    assert s.job_queue_size == 100
    assert s.load_models == ()
    assert s.enable_model_api is False
    assert s.disable_token_authorization is False
    assert dict(s.extra) == {}


# --- precedence: file < env (when enabled) < overrides -------------------------------------


def test_load_env_overrides_properties_only_when_enabled(tmp_path: Path) -> None:
    env = {"TS_JOB_QUEUE_SIZE": "9", "TS_LOG_DIR": "/var/log/mservd"}
    off = config.load(write(tmp_path, "job_queue_size=5\n"), env=env)
    assert off.job_queue_size == 5
    assert off.log_dir == "logs"

    on = config.load(write(tmp_path, "job_queue_size=5\nenable_envvars_config=true\n"), env=env)
    assert on.job_queue_size == 9
    assert on.log_dir == "/var/log/mservd"


def test_load_env_switch_enables_env_without_file() -> None:
    s = config.load(env={"TS_ENABLE_ENVVARS_CONFIG": "true", "TS_BATCH_SIZE": "8"})
    assert s.batch_size == 8
    assert s.enable_envvars_config is True


def test_load_env_switch_false_wins_over_file(tmp_path: Path) -> None:
    path = write(tmp_path, "enable_envvars_config=true\nbatch_size=2\n")
    s = config.load(path, env={"TS_ENABLE_ENVVARS_CONFIG": "false", "TS_BATCH_SIZE": "8"})
    assert s.batch_size == 2
    assert s.enable_envvars_config is False


def test_load_env_reads_models_block() -> None:
    models = {"m": {"2.0": {"batchSize": 3}}}
    s = config.load(env={"TS_ENABLE_ENVVARS_CONFIG": "true", "TS_MODELS": json.dumps(models)})
    assert s.models == models


def test_load_overrides_win_over_env_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "enable_envvars_config=true\njob_queue_size=5\nenable_snapshot=true\n")
    s = config.load(
        path,
        env={"TS_JOB_QUEUE_SIZE": "9"},
        overrides={"job_queue_size": 11, "snapshot": False, "model_store": None},
    )
    assert s.job_queue_size == 11
    assert s.snapshot is False
    assert s.model_store is None


def test_load_overrides_accept_strings_keys_and_paths(tmp_path: Path) -> None:
    s = config.load(
        env={},
        overrides={
            "enable_snapshot": "false",
            "job_queue_size": "12",
            "model_store": tmp_path,
            "allowed_urls": ["https://a/.*", "https://b/.*"],
        },
    )
    assert s.snapshot is False
    assert s.job_queue_size == 12
    assert s.model_store == str(tmp_path)
    assert s.allowed_urls == ("https://a/.*", "https://b/.*")


# --- every problem at once -------------------------------------------------------------------


def test_load_reports_every_bad_value_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "enable_envvars_config=true\n"
        "job_queue_size=abc\n"
        "inference_address=localhost:8080\n"
        "management_address=http://127.0.0.1:70000\n"
        "enable_model_api=yes\n"
        "batch_size=0\n"
        "token_expiration_min=soon\n"
        "allowed_urls=https://ok/.*,(unclosed\n"
        "metrics_mode=statsd\n"
        "grpc_inference_port=-1\n",
    )
    with pytest.raises(ConfigError) as info:
        config.load(
            path,
            env={"TS_MAX_BATCH_DELAY": "-5"},
            overrides={"log_format": "xml", "no_such_flag": 1},
        )
    err = info.value
    assert err.problems == [
        "job_queue_size: 'abc' is not an integer",
        "inference_address: 'localhost:8080' is not an http(s)://host:port address (port 0-65535)",
        (
            "management_address: 'http://127.0.0.1:70000' is not an http(s)://host:port address"
            " (port 0-65535)"
        ),
        "enable_model_api: 'yes' is not a boolean (use true or false)",
        "batch_size: 0 must be >= 1",
        "token_expiration_min: 'soon' is not a number",
        (
            "allowed_urls: '(unclosed' is not a valid regular expression:"
            " missing ), unterminated subpattern at position 0"
        ),
        "metrics_mode: 'statsd' is not one of prometheus, log",
        "grpc_inference_port: -1 is not a port (0-65535; 0 picks a free port)",
        "max_batch_delay (from TS_MAX_BATCH_DELAY): -5 must be >= 0",
        "log_format (from command line): 'xml' is not one of plain, json",
        "no_such_flag: not a setting (from command line)",
    ]
    assert str(err).startswith(
        "Invalid configuration:\n  job_queue_size: 'abc' is not an integer\n"
    )
    assert str(err).count("\n") == len(err.problems)


def test_load_reports_bad_env_switch() -> None:
    with pytest.raises(ConfigError) as info:
        config.load(env={"TS_ENABLE_ENVVARS_CONFIG": "on"})
    assert info.value.problems == [
        (
            "enable_envvars_config (from TS_ENABLE_ENVVARS_CONFIG): 'on' is not a boolean"
            " (use true or false)"
        )
    ]


def test_load_reports_models_block_bad_json_with_key(tmp_path: Path) -> None:
    path = write(tmp_path, 'models={"m": {"1.0": {"batchSize": 4}}\n')
    with pytest.raises(ConfigError) as info:
        config.load(path, env={})
    (problem,) = info.value.problems
    assert problem.startswith("models: invalid JSON: Expecting ',' delimiter: line 1 column")


def test_load_reports_models_block_wrong_shape_and_values(tmp_path: Path) -> None:
    models = {
        "a": [1],
        "b": {"1.0": "m.mar"},
        "c": {"1.0": {"batchSize": 0, "minWorkers": "x", "marName": "c.mar"}},
    }
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, f"models={json.dumps(models)}\n"), env={})
    assert info.value.problems == [
        "models: model 'a' must be an object of versions, got list",
        "models: model 'b' version '1.0' must be an object of settings, got str",
        "models: model 'c' version '1.0' batchSize: 0 must be >= 1",
        "models: model 'c' version '1.0' minWorkers: 'x' is not an integer",
    ]


def test_load_reports_models_block_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        config.load(write(tmp_path, "models=[1, 2]\n"), env={})
    assert info.value.problems == ["models: must be a JSON object, got list"]


# --- per-model settings ----------------------------------------------------------------------

MODELS_BLOCK = {
    "m": {
        "1.0": {
            "defaultVersion": True,
            "marName": "m.mar",
            "minWorkers": 2,
            "maxWorkers": 3,
            "batchSize": 4,
            "maxBatchDelay": 50,
            "responseTimeout": 30,
            "startupTimeout": 40,
            "jobQueueSize": 10,
            "deviceType": "gpu",
            "deviceIds": [1],
        }
    }
}


def test_resolve_model_settings_defaults_come_from_settings() -> None:
    s = Settings(batch_size=2, max_batch_delay=7, default_response_timeout=9, job_queue_size=5)
    assert config.resolve_model_settings(s, "m", "1.0") == ModelSettings(
        min_workers=1,
        max_workers=1,
        batch_size=2,
        max_batch_delay=7,
        response_timeout=9,
        startup_timeout=120,
        job_queue_size=5,
        device_type=None,
        device_ids=(),
        default_version=False,
    )


@pytest.mark.parametrize(("configured", "gpus", "expected"), [(0, 0, 1), (0, 4, 4), (3, 4, 3)])
def test_resolve_model_settings_default_workers_follow_gpus(
    configured: int, gpus: int, expected: int
) -> None:
    s = Settings(default_workers_per_model=configured)
    ms = config.resolve_model_settings(s, "m", "1.0", gpu_count=gpus)
    assert (ms.min_workers, ms.max_workers) == (expected, expected)


def test_resolve_model_settings_models_block_beats_defaults() -> None:
    s = Settings(models=MODELS_BLOCK)
    ms = config.resolve_model_settings(s, "m", "1.0")
    assert ms == ModelSettings(
        min_workers=2,
        max_workers=3,
        batch_size=4,
        max_batch_delay=50,
        response_timeout=30,
        startup_timeout=40,
        job_queue_size=10,
        device_type="gpu",
        device_ids=(1,),
        default_version=True,
    )
    other = config.resolve_model_settings(s, "m", "2.0")
    assert other.batch_size == 1 and other.default_version is False


def test_resolve_model_settings_yaml_beats_models_block() -> None:
    s = Settings(models=MODELS_BLOCK)
    yaml_config = {"batchSize": 8, "deviceType": "CPU", "deviceIds": [], "handler": {"k": 1}}
    ms = config.resolve_model_settings(s, "m", "1.0", model_yaml=yaml_config)
    assert (ms.batch_size, ms.device_type, ms.device_ids) == (8, "cpu", ())
    assert (ms.min_workers, ms.max_batch_delay) == (2, 50)  # untouched keys still from models=
    assert ms.default_version is True


def test_resolve_model_settings_api_beats_yaml() -> None:
    s = Settings(models=MODELS_BLOCK)
    ms = config.resolve_model_settings(
        s,
        "m",
        "1.0",
        model_yaml={"batchSize": 8, "responseTimeout": 60, "maxBatchDelay": 20},
        api={"batch_size": "16", "max_batch_delay": 5, "url": "m.mar", "synchronous": "true"},
    )
    assert (ms.batch_size, ms.max_batch_delay) == (16, 5)
    assert ms.response_timeout == 60  # from yaml
    assert ms.startup_timeout == 40  # from models=


def test_resolve_model_settings_initial_workers_sets_min_and_max() -> None:
    s = Settings(models=MODELS_BLOCK)
    ms = config.resolve_model_settings(s, "m", "1.0", api={"initial_workers": "4"})
    assert (ms.min_workers, ms.max_workers) == (4, 4)
    ms = config.resolve_model_settings(s, "m", "1.0", api={"initial_workers": 4, "max_worker": 6})
    assert (ms.min_workers, ms.max_workers) == (4, 6)


def test_resolve_model_settings_min_worker_without_max_sets_both() -> None:
    ms = config.resolve_model_settings(Settings(), "m", "1.0", api={"min_worker": 3})
    assert (ms.min_workers, ms.max_workers) == (3, 3)


def test_resolve_model_settings_unset_bound_follows_set_one() -> None:
    ms = config.resolve_model_settings(Settings(), "m", "1.0", model_yaml={"minWorkers": 4})
    assert (ms.min_workers, ms.max_workers) == (4, 4)
    ms = config.resolve_model_settings(
        Settings(), "m", "1.0", model_yaml={"maxWorkers": 1}, gpu_count=4
    )
    assert (ms.min_workers, ms.max_workers) == (1, 1)


def test_resolve_model_settings_max_below_min_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        config.resolve_model_settings(
            Settings(), "m", "1.0", api={"min_worker": "2", "max_worker": "1"}
        )
    assert info.value.problems == [
        "max_worker (1) must be >= min_worker (2) (max from API max_worker, min from API min_worker)"
    ]
    assert str(info.value).startswith("Invalid settings for model 'm' version '1.0':\n  ")


def test_resolve_model_settings_max_below_min_across_layers_names_sources() -> None:
    s = Settings(models={"m": {"1.0": {"minWorkers": 2}}})
    with pytest.raises(ConfigError) as info:
        config.resolve_model_settings(s, "m", "1.0", model_yaml={"maxWorkers": 1})
    assert info.value.problems == [
        (
            "max_worker (1) must be >= min_worker (2) (max from model-config.yaml maxWorkers,"
            " min from config.properties models['m']['1.0'] minWorkers)"
        )
    ]


def test_resolve_model_settings_reports_every_bad_value_by_source() -> None:
    with pytest.raises(ConfigError) as info:
        config.resolve_model_settings(
            Settings(),
            "m",
            "1.0",
            model_yaml={"batchSize": 0, "deviceType": "tpu", "deviceIds": [0, -1]},
            api={"min_worker": "x", "max_batch_delay": "-1", "response_timeout": "0"},
        )
    assert info.value.problems == [
        "model-config.yaml batchSize: 0 must be >= 1",
        "model-config.yaml deviceType: 'tpu' is not cpu or gpu",
        "model-config.yaml deviceIds: [0, -1] has a negative GPU id",
        "API min_worker: 'x' is not an integer",
        "API max_batch_delay: -1 must be >= 0",
        "API response_timeout: 0 must be > 0",
    ]


def test_a_number_too_large_to_mean_anything_is_refused_where_it_is_given() -> None:
    # 10**400 seconds passed every check and overflowed a clock later: the model's requests,
    # or its register call, got no answer at all
    huge = "1" + "0" * 400
    with pytest.raises(ConfigError) as info:
        config.resolve_model_settings(
            Settings(), "m", "1.0", model_yaml={"maxBatchDelay": 10**400},
            api={"response_timeout": huge, "startup_timeout": "1_0", "min_worker": "2**9"})
    too_large = f"an integer of at most {2**53} is needed; this one is larger"
    assert info.value.problems == [
        f"model-config.yaml maxBatchDelay: {too_large}",
        f"API response_timeout: {too_large}",
        "API startup_timeout: '1_0' is not an integer",
        "API min_worker: '2**9' is not an integer",
    ]
    largest = config.resolve_model_settings(Settings(), "m", "1.0",
                                            api={"response_timeout": str(2**53)})
    assert largest.response_timeout == 2**53


def test_resolve_model_settings_ignores_none_values() -> None:
    ms = config.resolve_model_settings(
        Settings(), "m", "1.0", model_yaml={"batchSize": None}, api={"batch_size": None}
    )
    assert ms.batch_size == 1


# --- model-config.yaml -----------------------------------------------------------------------


def test_read_model_yaml_reads_mapping(tmp_path: Path) -> None:
    path = tmp_path / "model-config.yaml"
    path.write_text("minWorkers: 1\nbatchSize: 4\nhandler:\n  threshold: 0.5\n")
    assert config.read_model_yaml(path) == {
        "minWorkers": 1,
        "batchSize": 4,
        "handler": {"threshold": 0.5},
    }


def test_read_model_yaml_empty_file_is_empty_mapping(tmp_path: Path) -> None:
    path = tmp_path / "model-config.yaml"
    path.write_text("")
    assert config.read_model_yaml(path) == {}


def test_read_model_yaml_rejects_non_mapping(tmp_path: Path) -> None:
    path = tmp_path / "model-config.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError) as info:
        config.read_model_yaml(path)
    assert info.value.problems == [f"{str(path)!r} must be a mapping of keys to values, got list"]


def test_read_model_yaml_rejects_bad_yaml(tmp_path: Path) -> None:
    path = tmp_path / "model-config.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        config.read_model_yaml(path)


# nine levels of nine: 43 million "lol"s once expanded, from a file of a few hundred bytes
_LAUGHS = "".join(
    f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9) if level else 'lol'}]\n"
    for level in range(9))


def test_read_model_yaml_refuses_a_yaml_alias_bomb_without_expanding_it(tmp_path: Path) -> None:
    path = tmp_path / "model-config.yaml"
    path.write_text(_LAUGHS + "batchSize: 4\n")
    with pytest.raises(ConfigError) as info:
        config.read_model_yaml(path)
    assert info.value.problems == [
        f"{str(path)!r} holds more than 100000 values once its YAML aliases are expanded"]


def test_read_model_yaml_refuses_a_file_over_a_mebibyte_before_parsing_it(
        tmp_path: Path) -> None:
    path = tmp_path / "model-config.yaml"
    path.write_text("labels:\n" + "  - a_label_of_some_length\n" * 50_000)
    with pytest.raises(ConfigError) as info:
        config.read_model_yaml(path)
    assert info.value.problems == [f"{str(path)!r} is larger than 1048576 bytes"]


def test_read_model_yaml_keeps_aliases_that_stay_small(tmp_path: Path) -> None:
    path = tmp_path / "model-config.yaml"
    path.write_text("labels: &labels [cat, dog]\nhandler: {classes: *labels}\n")
    assert config.read_model_yaml(path)["handler"] == {"classes": ["cat", "dog"]}


@pytest.mark.parametrize("key", ["batchSize", "maxBatchDelay", "deviceType", "deviceIds",
                                 "continuousBatching", "maxLatencyMs"])
def test_a_huge_model_config_value_is_named_in_a_bounded_message(key) -> None:
    """A value that is a huge structure (YAML aliases) is printed shortened, never whole."""
    laughs = ["lol"] * 9
    for _ in range(8):
        laughs = [laughs] * 9  # shared, as a YAML alias makes it: 43 million strings as text
    with pytest.raises(ConfigError) as info:
        config.resolve_model_settings(config.Settings(), "m", "1.0", model_yaml={key: laughs})
    (problem,) = info.value.problems
    assert problem.startswith(f"model-config.yaml {key}: [[[") and len(problem) < 400


def test_load_reads_models_from_a_kserve_model_snapshot(tmp_path) -> None:
    path = tmp_path / "config.properties"
    path.write_text(
        'model_snapshot={"name":"startup.cfg","modelCount":1,"models":{"mnist":{"1.0":'
        '{"defaultVersion":true,"marName":"mnist.mar","minWorkers":2,"batchSize":4}}}}\n')
    settings = config.load(path)
    assert settings.models["mnist"]["1.0"]["marName"] == "mnist.mar"
    model = config.resolve_model_settings(settings, "mnist", "1.0")
    assert (model.min_workers, model.batch_size) == (2, 4)


def test_load_reports_a_broken_model_snapshot(tmp_path) -> None:
    path = tmp_path / "config.properties"
    path.write_text('model_snapshot={"models": 3}\n')
    with pytest.raises(ConfigError, match="model_snapshot"):
        config.load(path)


def test_metrics_config_model_metrics_are_read_in_torchserves_shape(tmp_path) -> None:
    from mservd.config import read_model_metrics

    good = tmp_path / "good.yaml"
    good.write_text("dimensions:\n  - &model_name ModelName\n"
                    "ts_metrics:\n  gauge:\n    - name: CPUUtilization\n      unit: Percent\n"
                    "model_metrics:\n  gauge:\n    - name: SizeOfImage\n      unit: kB\n"
                    "      dimensions: [*model_name, Level]\n"
                    "  counter:\n    - name: Calls\n      unit: count\n      dimensions: []\n")
    assert read_model_metrics(str(good)) == [
        {"name": "SizeOfImage", "unit": "kB", "dimensions": ["ModelName", "Level"],
         "type": "gauge"},
        {"name": "Calls", "unit": "count", "dimensions": [], "type": "counter"}]


def test_a_metrics_config_that_is_not_torchserves_shape_stops_the_start(tmp_path) -> None:
    bad = tmp_path / "metrics.yaml"
    bad.write_text("model_metrics:\n  speed:\n    - name: X\n")
    properties = tmp_path / "config.properties"
    properties.write_text(f"metrics_config={bad}\n")
    with pytest.raises(ConfigError, match="model_metrics.speed must be one of counter"):
        config.load(config_file=str(properties))


def test_torchserve_model_config_keys_mservd_does_not_apply_are_named_in_a_warning(
        caplog) -> None:
    yaml_config = {"minWorkers": 1, "parallelType": "pp", "torchrun": {"nproc-per-node": 4},
                   "useJobTicket": True, "handler": {"profile": True}}
    with caplog.at_level(logging.WARNING, logger="mservd.config"):
        settings = config.resolve_model_settings(Settings(), "m", "1.0", model_yaml=yaml_config)
    assert settings.min_workers == 1
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3 and all("not applied by mservd" in w for w in warned)
    assert [w.split("'s ")[1].split(" ")[0] for w in warned] == [
        "parallelType", "torchrun", "useJobTicket"]


def test_dollar_dollar_names_in_config_values_are_environment_variables_as_in_torchserve(
        tmp_path) -> None:
    properties = tmp_path / "config.properties"
    properties.write_text("inference_address=http://127.0.0.1:$$MY_PORT$$\n"
                          "allowed_urls=https://$$HOST$$/.*,file://.*\n")
    settings = config.load(properties, env={"MY_PORT": "9090", "HOST": "models.example"})
    assert settings.inference_address == "http://127.0.0.1:9090"
    assert settings.allowed_urls == ("https://models.example/.*", "file://.*")
    properties.write_text("job_queue_size=$$QUEUE$$\n")
    with pytest.raises(ConfigError) as err:
        config.load(properties, env={})
    assert err.value.problems == [
        "job_queue_size: the environment variable QUEUE (in $$QUEUE$$) is not set"]
    with pytest.raises(ConfigError) as err:  # a value from the environment is not shown
        config.load(properties, env={"QUEUE": "hunter2"})
    assert err.value.problems == [
        "job_queue_size (from $$QUEUE$$, not shown): the value is not valid for this key"]


def test_torchserve_properties_mservd_does_not_apply_are_named_in_a_warning(
        tmp_path, caplog) -> None:
    properties = tmp_path / "config.properties"
    properties.write_text("number_of_netty_threads=4\nservice_envelope=kservev2\n"
                          "vmargs=-Xmx4g\n")  # the JVM's: nothing to say about it
    with caplog.at_level(logging.WARNING, logger="mservd.config"):
        config.load(properties, env={})
    warned = sorted(r.getMessage().split(" ")[0] for r in caplog.records)
    assert warned == ["number_of_netty_threads", "service_envelope"]
    assert all("is not applied by mservd" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("text", "says"), [
    ("model_metrics: " + "[" * 100_000, "cannot be read as YAML"),
    # a billion laughs: small as a file, gigabytes once written out; refused unprinted
    ("a: &a [x, x, x, x, x, x, x, x, x, x]\n"
     + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n"
               for p, c in zip("abcdefgh", "bcdefghi"))
     + "model_metrics:\n  gauge:\n    - {name: M, dimensions: *i}\n", "strings"),
    ("model_metrics:\n  gauge:\n    - {name: M, unit: [1, 2]}\n", "strings"),
])
def test_a_hostile_metrics_config_is_refused_cleanly(tmp_path, text, says) -> None:
    from mservd.config import read_model_metrics

    path = tmp_path / "metrics.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=says) as err:
        read_model_metrics(str(path))
    assert len(str(err.value)) < 1000
