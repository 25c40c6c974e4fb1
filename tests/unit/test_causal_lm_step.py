"""The causal LM handler's step, driven as the continuous loop drives it, on the real SmolLM2
sample: what one step may cost (logits for the sampled positions only, at most its token
budget), what the KV cache's size means for a request, and that what one request sends fails
that request alone. The engine's own behaviour is pinned in test_paged_engine.py."""

from __future__ import annotations

import uuid
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from handlers import causal_lm
from handlers.causal_lm import CausalLM
from handlers.errors import RequestError
from handlers.mock_context import MockContext
from handlers.ts_compat import install_ts_aliases

ARCHIVE = Path(__file__).resolve().parents[2] / "model_store" / "smollm2.mar"

install_ts_aliases()  # the handler reports its metrics through ts.metrics, as in a worker


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    if not ARCHIVE.exists():
        pytest.skip("the smollm2 sample is not built (make samples)")
    folder = tmp_path_factory.mktemp("smollm2")
    with zipfile.ZipFile(ARCHIVE) as archive:
        archive.extractall(folder)
    return folder


def handler(model_dir: Path, kv: Any = None,
            **settings: Any) -> tuple[CausalLM, MockContext, list[dict]]:
    """A handler whose model's every forward pass is recorded: input and logits shapes."""
    context = MockContext(model_dir=str(model_dir))
    context.model_yaml_config = {"continuousBatching": "true", "handler": settings}
    if kv is not None:
        context.model_yaml_config["kvCacheMemory"] = kv
    lm = CausalLM()
    lm.initialize(context)
    passes: list[dict] = []
    def record(_module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        tokens = args[0] if args else kwargs["input_ids"]
        passes.append({"input": tuple(tokens.shape), "logits": tuple(output.logits.shape)})

    lm.model.register_forward_hook(record, with_kwargs=True)
    return lm, context, passes


def run(lm: CausalLM, context: MockContext, rows: list[Any],
        steps: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Steps until every request ends, as the worker's loop calls them: each request's text,
    or its error (and in ``steps``, each step's outputs)."""
    run_id = uuid.uuid4().hex[:8]  # request ids are never reused, as a server's are not
    live = {f"r{i}-{run_id}": row for i, row in enumerate(rows)}
    done: dict[str, Any] = {rid: "" for rid in live}
    for _ in range(500):
        if not live:
            return {rid.split("-")[0]: answer for rid, answer in done.items()}
        ids = list(live)
        context.request_ids = dict(enumerate(ids))
        outputs = lm.handle([live[rid] for rid in ids], context)
        if steps is not None:
            steps.append({rid.split("-")[0]: out for rid, out in zip(ids, outputs)})
        for rid, output, stops in zip(ids, outputs, context.stopping_criteria):
            if isinstance(output, RequestError):
                done[rid] = output
            else:
                done[rid] += str(output)
            if isinstance(output, RequestError) or stops(output):
                del live[rid]
                context.cache.pop(rid, None)
    raise AssertionError("the requests did not end in 500 steps")


def test_logits_are_kept_for_the_last_position_alone(model_dir) -> None:
    """A 1,001-token prompt made 249 MiB of logits: one row of the vocabulary per position."""
    lm, context, passes = handler(model_dir)
    run(lm, context, [{"body": {"prompt": "word " * 300, "max_tokens": 2}}])
    prefill = passes[0]
    assert prefill["input"][1] > 300
    assert prefill["logits"] == (1, 1, lm.model.config.vocab_size)


def greedy_alone(lm: CausalLM, text: str, count: int) -> str:
    ids = lm.tokenizer(text, return_tensors="pt")["input_ids"]
    out = lm.model.generate(ids, max_new_tokens=count, do_sample=False)
    return lm.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_a_step_runs_at_most_prefill_tokens_and_gives_what_generate_gives(model_dir) -> None:
    lm, context, passes = handler(model_dir, prefill_tokens=40)
    texts = [f"Tell me about number {i} " + "please " * 20 for i in range(3)]
    answers = run(lm, context, [{"body": {"prompt": text, "max_tokens": 3}} for text in texts])
    assert max(p["input"][1] for p in passes) <= 40  # 27 tokens each: some split over steps
    for i, text in enumerate(texts):
        assert answers[f"r{i}"] == greedy_alone(lm, text, 3)


@pytest.mark.parametrize(("row", "status", "words"), [
    ({"body": bytearray(b"[" * 50000)}, 400, "nested too deeply"),
    ({"body": {"prompt": "x" * 200_000}}, 400, "handler.max_prompt_characters"),
    ({"body": {"prompt": "Hi", "top_p": 0}}, 400, "top_p must be above 0"),
    ({"body": {"messages": [{"role": "wizard", "content": "Hi"}] * 2}}, None, None),
], ids=["deep-json", "characters", "top-p-zero", "odd-role"])
def test_a_request_fails_alone_beside_one_that_generates(model_dir, row, status,
                                                         words) -> None:
    lm, context, _ = handler(model_dir)
    good = {"body": {"prompt": "The capital of France is", "max_tokens": 6}}
    answers = run(lm, context, [good, row])
    ids = lm.tokenizer("The capital of France is", return_tensors="pt")["input_ids"]
    alone = lm.model.generate(ids, max_new_tokens=6, do_sample=False)
    assert answers["r0"] == lm.tokenizer.decode(alone[0, ids.shape[1]:],
                                                skip_special_tokens=True)
    if status is not None:
        assert isinstance(answers["r1"], RequestError) and answers["r1"].status == status
        assert words in answers["r1"].message


def test_a_request_the_kv_cache_cannot_hold_is_refused_and_one_it_cannot_hold_yet_waits(
        model_dir) -> None:
    """8 blocks of 32 tokens: a request of 300 is refused (400) alone; of three requests of
    about 100 prompt tokens, the one that does not fit yet gets no text while the others run,
    then runs (and so does one preempted)."""
    lm, context, _ = handler(model_dir, kv=8 * 32 * 2 * 30 * 3 * 64 * 4)
    assert lm.engine.capacity == 256
    texts = [f"Story {i}: " + "once upon a time " * 24 for i in range(3)]
    rows = [{"body": {"prompt": text, "max_tokens": 40, "ignore_eos": True}} for text in texts]
    rows.append({"body": {"prompt": "Hi " * 100, "max_tokens": 200}})
    steps: list[dict[str, Any]] = []
    answers = run(lm, context, rows, steps)
    assert isinstance(answers["r3"], RequestError) and answers["r3"].status == 400
    assert "256 tokens this worker's KV cache holds (kvCacheMemory)" in answers["r3"].message
    waited = [rid for rid in ("r0", "r1", "r2") if any(
        step[rid].completion_tokens == 0 and any(step[other].completion_tokens > 0
                                                 for other in ("r0", "r1", "r2"))
        for step in steps[2:] if rid in step)]
    assert waited
    for i, text in enumerate(texts):
        assert answers[f"r{i}"] == greedy_alone(lm, text, 40)


def test_a_seeded_request_gives_the_same_tokens_whatever_it_runs_beside(model_dir) -> None:
    lm, context, _ = handler(model_dir)
    seeded = {"body": {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0.9,
                       "top_p": 0.9, "seed": 7}}
    others = [{"body": {"prompt": "Name three colors.", "max_tokens": 8, "temperature": 1.2}},
              {"body": {"prompt": "The capital of France is", "max_tokens": 5}}]
    first = run(lm, context, [seeded])["r0"]
    second = run(lm, context, [*others, seeded])["r2"]
    assert first == second and first


def test_a_request_that_leaves_mid_stream_frees_its_blocks(model_dir) -> None:
    lm, context, _ = handler(model_dir)
    rows = [{"body": {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True}},
            {"body": {"prompt": "The capital of France is", "max_tokens": 6}}]
    context.request_ids = {0: "going", 1: "staying"}
    for _ in range(3):
        lm.handle(rows, context)
    assert lm.engine.blocks_held("going") >= 1
    context.cache.pop("going")  # the worker's loop, on a CANCEL
    context.request_ids = {0: "staying"}
    [out] = lm.handle(rows[1:], context)
    assert lm.engine.blocks_held("going") == 0 and "going" not in lm.sequences
    assert out.completion_tokens > 0 and out.finish_reason is None


def test_requests_that_come_together_start_in_one_step_and_one_beside_streams_joins_it(
        model_dir, monkeypatch) -> None:
    # the step waits for the reads of the requests that came with it (JOIN_WAIT, raised here
    # so that the test pins that, not this machine's speed): none waits a step more
    monkeypatch.setattr(causal_lm, "JOIN_WAIT", 30.0)
    lm, context, _ = handler(model_dir)
    rows = [{"body": {"prompt": f"Tell me about {topic}", "max_tokens": 50, "ignore_eos": True}}
            for topic in ("cats", "dogs", "birds", "fish")]
    context.request_ids = {0: "a", 1: "b", 2: "c"}
    first = lm.handle(rows[:3], context)  # nothing runs: all three reads are waited for
    assert all(out.completion_tokens == 1 for out in first)
    context.request_ids = {0: "a", 1: "b", 2: "c", 3: "d"}
    joined = lm.handle(rows, context)  # three decode, and "d" came with this step
    assert [out.completion_tokens for out in joined] == [2, 2, 2, 1]


def test_a_failing_sampler_ends_its_sequence_alone(model_dir, monkeypatch) -> None:
    lm, context, _ = handler(model_dir)
    pick = CausalLM.pick

    def broken_for_hot(seq, logits):
        if seq.temperature == 1.5:
            raise RuntimeError("the sampler broke")
        return pick(seq, logits)

    monkeypatch.setattr(lm, "pick", broken_for_hot)
    answers = run(lm, context, [{"body": {"prompt": "Hi", "max_tokens": 5}},
                                {"body": {"prompt": "Hi", "max_tokens": 5, "temperature": 1.5}}])
    assert isinstance(answers["r0"], str) and answers["r0"]
    assert answers["r1"].status == 500 and "the sampler broke" in answers["r1"].message
    assert torch.is_inference_mode_enabled() is False


COUNT = [{"role": "user", "content": "Count from 1 to 30, as '1. 1' lines"}]


@pytest.mark.parametrize(("stop", "ends"), [("\n6.", "5. 5"), ([". 4"], "3. 3\n4")],
                         ids=["newline-six-dot", "dot-space-four"])
def test_a_stop_string_across_tokens_cuts_the_answer_exactly_before_it(model_dir, stop,
                                                                        ends) -> None:
    """The answer ended '5. 5\\n6' and '3. 3\\n4. ': the start of the stop string had been
    sent before its end came."""
    lm, context, _ = handler(model_dir)
    answers = run(lm, context, [{"body": {"messages": COUNT, "max_tokens": 60, "stop": stop}},
                                {"body": {"messages": COUNT, "max_tokens": 60}}])
    assert answers["r0"].endswith(ends) and answers["r1"].startswith(answers["r0"])
    assert answers["r1"][len(answers["r0"]):].startswith(stop if isinstance(stop, str)
                                                         else stop[0])


def test_streamed_text_is_the_whole_answers_decoding_with_characters_across_tokens(
        model_dir) -> None:
    """Each step decodes a few tokens, not the whole answer again; the pieces still join to
    what decoding the whole answer gives, a character split over tokens included."""
    lm, context, _ = handler(model_dir)
    messages = [{"role": "user", "content": "Répète: «Ça va très bien», puis écris 北京 🎉🎉"}]
    answer = run(lm, context, [{"body": {"messages": messages, "max_tokens": 40}}])["r0"]
    ids = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                           return_tensors="pt")["input_ids"]
    alone = lm.model.generate(ids, max_new_tokens=40, do_sample=False)
    assert answer == lm.tokenizer.decode(alone[0, ids.shape[1]:], skip_special_tokens=True)
    assert any(ord(c) > 0xFFFF for c in answer) or any("\u4e00" <= c <= "\u9fff"
                                                       for c in answer)


@pytest.mark.parametrize(("text", "stops", "count"), [
    ("abc\n6", ["\n6."], 2), ("abc", ["\n6."], 0), ("a. ", [". 4", " x"], 2), ("x", [], 0),
    ("ab", ["b", "abc"], 2),
])
def test_held_is_the_longest_end_that_may_begin_a_stop_string(text, stops, count) -> None:
    from handlers.causal_lm import held

    assert held(text, stops) == count


@pytest.mark.parametrize(("row", "words"), [
    ({"prompt": "Hi", "stop": ["x" * 257]}, "each of at most 256 characters"),
    ({"messages": [{"role": "r" * 65, "content": "Hi"}]}, "role of at most 64"),
    ({"messages": [{"role": "user", "content": "Hi", "name": "n" * 200_000}]},
     "handler.max_prompt_characters"),
], ids=["long-stop", "long-role", "long-name"])
def test_every_string_a_request_sends_is_bounded_before_it_is_templated(model_dir, row,
                                                                       words) -> None:
    """A 3,000,000-character role was templated and tokenised (2 s) before its tokens were
    counted; a stop string of 200,000 characters was matched at every token of every step."""
    lm, context, _ = handler(model_dir)
    answer = run(lm, context, [{"body": row}])["r0"]
    assert isinstance(answer, RequestError) and words in answer.message


def test_a_static_batch_keeps_a_refused_requests_error_and_reads_it_once(model_dir,
                                                                         monkeypatch) -> None:
    """Without continuousBatching one call runs the batch to its end: a refused request stays
    in it, and was read again (and answered 200 with no text) at every step."""
    from handlers.mock_context import MockContext

    lm, _, _ = handler(model_dir)
    lm.continuous = False
    reads = []
    read = lm.read
    monkeypatch.setattr(lm, "read", lambda row: (reads.append(row), read(row))[1])
    context = MockContext(model_dir=str(model_dir))
    context.cache = {}
    context.request_ids = {0: "good", 1: "bad"}
    import sys
    import types
    sent = []
    utils = types.ModuleType("ts.handler_utils.utils")
    utils.send_intermediate_predict_response = lambda outputs, *args: sent.append(outputs)
    monkeypatch.setitem(sys.modules, "ts.handler_utils.utils", utils)
    outputs = lm.handle([{"body": {"prompt": "Hi", "max_tokens": 4}},
                         {"body": {"prompt": "Hi", "top_p": 0}}], context)
    assert isinstance(outputs[1], RequestError) and outputs[1].status == 400
    assert len(reads) == 2 and sent  # each read once, over several steps


def test_dtype_is_float32_on_the_cpu_unless_set(model_dir) -> None:
    lm, context, _ = handler(model_dir)
    assert next(lm.model.parameters()).dtype == torch.float32  # auto, on the CPU
    lm, context, _ = handler(model_dir, dtype="bfloat16")
    assert next(lm.model.parameters()).dtype == torch.bfloat16
    answer = run(lm, context, [{"body": {"prompt": "The capital of France is",
                                         "max_tokens": 4}}])["r0"]
    assert isinstance(answer, str) and answer
    with pytest.raises(ValueError, match="handler.dtype 'fp8' is not one of auto, float32"):
        handler(model_dir, dtype="fp8")


def test_the_prompt_share_settings_reach_the_engine_and_a_bad_stretch_is_refused(
        model_dir) -> None:
    lm, _, _ = handler(model_dir)
    assert (lm.engine.streaming_batch_tokens, lm.engine.clock.stretch) == (32, 2.0)  # the CPU's
    lm, _, _ = handler(model_dir, stream_step_tokens=48, stream_step_stretch=1.5)
    assert (lm.engine.streaming_batch_tokens, lm.engine.clock.stretch) == (48, 1.5)
    for bad in ("lots", 0.5, None):
        with pytest.raises(ValueError, match="stream_step_stretch .* is not a number of at "
                                             "least 1"):
            handler(model_dir, stream_step_stretch=bad)


def test_a_failing_engine_step_fails_its_rows_and_the_next_requests_run(model_dir,
                                                                        monkeypatch) -> None:
    """Any failure of the shared step but the cache's lack of room raises (the worker fails
    the step's requests) and leaves the engine empty, ready for the next ones."""
    lm, context, _ = handler(model_dir)
    step = lm.engine.processor._generation_step
    monkeypatch.setattr(lm.engine.processor, "_generation_step",
                        lambda model: (_ for _ in ()).throw(RuntimeError("device lost")))
    context.request_ids = {0: "doomed"}
    with pytest.raises(RuntimeError, match="device lost"):
        for _ in range(20):
            lm.handle([{"body": {"prompt": "Hi", "max_tokens": 4}}], context)
    context.cache.pop("doomed", None)  # the worker's loop: the step's requests leave
    assert not lm.engine.requests and not lm.sequences
    monkeypatch.setattr(lm.engine.processor, "_generation_step", step)
    answer = run(lm, context, [{"body": {"prompt": "The capital of France is",
                                         "max_tokens": 6}}])["r0"]
    assert answer == greedy_alone(lm, "The capital of France is", 6)
