"""Context, metrics, streaming and error values of the handler side."""

from __future__ import annotations

import logging

import pytest

from handlers.context import Context, ResponseMeta
from handlers.errors import BadInputError, PredictionException, RequestError
from handlers.metrics import MetricsRecorder, MetricTypes
from handlers.streaming import send_intermediate_predict_response


def make_context(**kwargs: object) -> Context:
    manifest = {"model": {"modelName": "m", "handler": "h.py"}}
    return Context("m", "/models/m", manifest, 4, None, "0.1.0", **kwargs)  # type: ignore[arg-type]


def test_context_system_properties_match_torchserve_keys() -> None:
    ctx = Context("m", "/models/m", {"model": {}}, 8, 1, "0.1.0", limit_max_image_pixels=False)
    assert ctx.system_properties == {
        "model_dir": "/models/m",
        "gpu_id": 1,
        "batch_size": 8,
        "server_name": "mservd",
        "server_version": "0.1.0",
        "limit_max_image_pixels": False,
    }
    assert ctx.model_name == "m"
    assert ctx.manifest == {"model": {}}
    assert ctx.model_yaml_config == {}
    assert isinstance(ctx.metrics, MetricsRecorder)


def test_context_keeps_model_yaml_config_and_given_metrics() -> None:
    recorder = MetricsRecorder()
    ctx = make_context(metrics=recorder, model_yaml_config={"handler": {"topk": 3}})
    assert ctx.metrics is recorder
    assert ctx.model_yaml_config == {"handler": {"topk": 3}}


def test_context_request_headers_are_case_insensitive() -> None:
    ctx = make_context()
    ctx.begin_batch(["id-0", "id-1"], [{"Explain": "True", "X-Token": "a"}, {}])
    assert ctx.request_ids == {0: "id-0", 1: "id-1"}
    assert ctx.get_request_id() == "id-0"
    assert ctx.get_request_id(1) == "id-1"
    assert ctx.get_request_id(5) is None
    assert ctx.get_request_header(0, "explain") == "True"
    assert ctx.get_request_header(0, "x-token") == "a"
    assert ctx.request_processor[0].get_request_property("X-TOKEN") == "a"
    assert ctx.get_request_header(1, "explain") is None
    assert ctx.get_all_request_header(0) == {"explain": "True", "x-token": "a"}
    headers = ctx.get_all_request_header(0)  # as a TorchServe handler may look them up
    assert headers["X-Token"] == "a" and headers.get("EXPLAIN") == "True"
    assert "X-Token" in headers and headers.get("X-Missing", "-") == "-"


def test_context_response_status_headers_and_content_type_per_request() -> None:
    ctx = make_context()
    ctx.begin_batch(["a", "b", "c"], [{}, {}, {}])
    ctx.set_response_status(201, "Created", idx=1)
    ctx.set_response_header(1, "X-Extra", "yes")
    ctx.set_response_content_type(1, "text/csv")
    assert ctx.get_response_status(0) == (200, None)
    assert ctx.get_response_status(1) == (201, "Created")
    assert ctx.get_response_content_type(1) == "text/csv"
    assert ctx.get_response_headers(1) == {"X-Extra": "yes", "content-type": "text/csv"}
    assert ctx.response_meta(1) == ResponseMeta(201, "Created", {"X-Extra": "yes"}, "text/csv")
    assert ctx.response_meta(0) == ResponseMeta(200, None, {}, None)

    ctx.set_all_response_status(202, "Accepted")
    assert [ctx.response_meta(i).status for i in range(3)] == [202, 202, 202]


def test_context_content_type_lookup_ignores_header_case() -> None:
    ctx = make_context()
    ctx.begin_batch(["a"], [{}])
    ctx.set_response_header(0, "Content-Type", "image/png")
    assert ctx.get_response_content_type(0) == "image/png"
    assert ctx.response_meta(0).content_type == "image/png"
    assert ctx.response_meta(0).headers == {}


def test_context_begin_batch_resets_previous_batch() -> None:
    ctx = make_context()
    ctx.begin_batch(["a"], [{}])
    ctx.set_response_status(500, "no", idx=0)
    ctx.begin_batch(["b"], [{}])
    assert ctx.response_meta(0) == ResponseMeta(200, None, {}, None)
    assert ctx.request_ids == {0: "b"}


def test_context_begin_batch_refuses_mismatched_lengths() -> None:
    ctx = make_context()
    with pytest.raises(ValueError, match="2 request ids but 1 header dicts"):
        ctx.begin_batch(["a", "b"], [{}])


def test_streaming_calls_the_worker_callback_and_keeps_the_handlers_status() -> None:
    ctx = make_context()
    ctx.begin_batch(["a", "b"], [{}, {}])
    sent: list[tuple[int, object]] = []
    ctx.stream_callback = lambda idx, item: sent.append((idx, item))
    ctx.set_response_status(206, "Partial Content", 1)
    assert send_intermediate_predict_response(["x", "y"], ctx.request_ids, "Partial", 200, ctx)
    assert sent == [(0, "x"), (1, "y")]
    # TorchServe's code and message describe the message; each request keeps its own status
    assert ctx.get_response_status(0)[0] == 200
    assert ctx.get_response_status(1) == (206, "Partial Content")


def test_streaming_without_a_callback_says_so() -> None:
    ctx = make_context()
    ctx.begin_batch(["a"], [{}])
    with pytest.raises(RuntimeError, match="no streaming transport"):
        ctx.send_intermediate(0, "x")


def test_metrics_recorder_records_and_drains_samples() -> None:
    recorder = MetricsRecorder("resnet")
    recorder.add_time("HandlerTime", 12.5, None, "ms")
    recorder.add_counter("Seen", 2, dimensions={"Kind": "image"})
    recorder.add_size("Mem", 3, unit="GB")
    recorder.add_percent("Util", 50)
    recorder.add_error("Oops", 1)
    recorder.add_metric("Custom", 7, "count", dimensions=[("A", "b")])
    samples = recorder.drain()
    assert [(s.name, s.value, s.unit, s.kind) for s in samples] == [
        ("HandlerTime", 12.5, "ms", MetricTypes.GAUGE),
        ("Seen", 2.0, "count", MetricTypes.COUNTER),
        ("Mem", 3.0, "GB", MetricTypes.GAUGE),
        ("Util", 50.0, "percent", MetricTypes.GAUGE),
        ("Oops", 1.0, "", MetricTypes.COUNTER),
        ("Custom", 7.0, "count", MetricTypes.COUNTER),
    ]
    assert samples[1].dimensions == {"ModelName": "resnet", "Level": "Model", "Kind": "image"}
    assert samples[5].dimensions["A"] == "b"
    assert recorder.drain() == []


def test_metrics_declared_metric_updates_with_dimension_values() -> None:
    recorder = MetricsRecorder()
    metric = recorder.add_metric_to_cache("Tokens", "count", ["Route"], MetricTypes.COUNTER)
    assert recorder.get_metric("Tokens", MetricTypes.COUNTER) is metric
    metric.add_or_update(5, ["fast"])
    [sample] = recorder.drain()
    assert (sample.name, sample.value, sample.dimensions) == ("Tokens", 5.0, {"Route": "fast"})
    with pytest.raises(KeyError, match="'Nope' of type 'gauge' was not declared"):
        recorder.get_metric("Nope", "gauge")


def test_a_wrong_metric_update_is_logged_and_never_fails_the_handler(caplog) -> None:
    recorder = MetricsRecorder("m")
    metric = recorder.add_metric_to_cache("Tokens", "count", ["Route"], MetricTypes.COUNTER)
    with caplog.at_level(logging.ERROR, logger="handlers.metrics"):
        metric.add_or_update(1, [])  # TorchServe logs these too, and goes on
        metric.add_or_update(-2, ["fast"])
    assert recorder.drain() == []
    assert "one value per dimension name" in caplog.text
    assert "cannot go down" in caplog.text


def test_metrics_torchserve_declares_and_those_recorded_are_found_by_get_metric() -> None:
    recorder = MetricsRecorder("m")
    handler_time = recorder.get_metric("HandlerTime", MetricTypes.GAUGE)  # TorchServe's default
    assert handler_time.dimension_names == ["ModelName", "Level"]
    recorder.add_size("SizeOfImage", 3.5, None, "kB")
    size = recorder.get_metric("SizeOfImage", MetricTypes.GAUGE)  # declared by the add
    size.add_or_update(4.0, ["m", "Model"])
    assert [s.value for s in recorder.drain()] == [3.5, 4.0]
    declared = MetricsRecorder("m", [{"name": "Calls", "unit": "count", "dimensions": [],
                                      "type": "counter"}])
    assert declared.get_metric("Calls").unit == "count"
    with pytest.raises(KeyError):  # a metrics_config replaces TorchServe's defaults
        declared.get_metric("HandlerTime", MetricTypes.GAUGE)


def test_metrics_refuse_unknown_units() -> None:
    with pytest.raises(ValueError, match="Time unit 'h'"):
        MetricsRecorder().add_time("T", 1, unit="h")


def test_errors_keep_torchserve_shape() -> None:
    exc = PredictionException("boom", 507)
    assert (exc.message, exc.error_code, str(exc)) == ("boom", 507, "boom : 507")
    assert BadInputError("bad").error_code == 400
    assert isinstance(BadInputError("bad"), PredictionException)


def test_request_error_from_exception() -> None:
    assert RequestError.from_exception(BadInputError("not an image")) == RequestError(
        400, "not an image", "BadInput"
    )
    assert RequestError.from_exception(PredictionException("oom", 507)) == RequestError(
        507, "oom", "InternalServerException"
    )
    assert RequestError.from_exception(KeyError("x")) == RequestError(
        500, "KeyError: 'x'", "InternalServerException"
    )
