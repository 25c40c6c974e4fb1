"""Text generation with a transformers causal LM, one decoding step per call (continuous batching).

Written the way TorchServe's continuous-batching handlers are, so the same file runs on
TorchServe 0.12 (it imports nothing of mservd): with ``continuousBatching: true`` in
model-config.yaml the server calls :meth:`CausalLM.handle` once per step with every running
request (new ones first appear with their body); each call runs one step of the engine and
returns one text delta per request.
``context.stopping_criteria`` tells the server which are finished; their state leaves
``context.cache`` and the slot is free for the next request. Without ``continuousBatching`` one
call runs its batch to the end, streaming each step's deltas with
``send_intermediate_predict_response``.

The engine is transformers' continuous batching, stepped from here (``paged_engine.py``): the
sequences' keys and values live in a paged KV cache of fixed size (model-config.yaml
``kvCacheMemory``); a request that does not fit yet waits in its queue (no text yet), a running
one that cannot grow is preempted and recomputed later, a prompt that begins with blocks
already in the cache reuses them, and a step runs every decoding sequence and then as much of
the waiting prompts as its token budget (``prefill_tokens``; while some decode, their tokens
and ``stream_step_tokens`` for each prompt in line, or what stretches their step to
``stream_step_stretch`` times its time if that is more) leaves, so a long prompt is
prefilled over several steps while the others go on, and a queue of prompts drains faster
than one prompt alone would. The engine picks no tokens: each
sequence's next token is picked here, with its own settings and seed, so a seeded request
gives the same tokens whatever it runs beside. Greedy output is the tokens ``generate()``
gives for that prompt alone.

A request body is JSON: ``{"prompt": "..."}`` or ``{"messages": [{"role", "content"}, ...]}``
(through the tokenizer's chat template), with ``max_tokens``, ``temperature``, ``top_p``,
``seed``, ``stop`` (a string or a list) and ``ignore_eos``; a plain text body is the prompt.

What a request sends fails that request alone, never the others of the step: a new request
is read (parsed, its size checked, templated and tokenised) on a thread of its own while the
running sequences go on decoding, and joins at the first step after it is read; a body that
cannot be read, a prompt too long, a failing prefill or a failing sampler answers its own
requests with an error; so does a prompt and ``max_tokens`` that the model's context or the
whole KV cache cannot hold (400, before it reaches the engine). A step the cache has no room
for ends its largest sequence alone. Any other failure of the shared step fails the step's
sequences (and never the worker).

OpenAI's generation fields are read here too, each with a module of its own beside this file:
``logit_bias``, ``presence_penalty`` and ``frequency_penalty`` (``logit_rules.py``),
``logprobs`` and ``top_logprobs`` (``logprobs.py``), ``response_format`` (``constrained.py``:
constrained decoding with llguidance, imported when a request needs it) and ``tools``,
``tool_choice``, ``parallel_tool_calls`` (``tool_calls.py``); a prompt may also come as token
ids (``prompt_token_ids``). They shape only the sequence that sets them: the others of the
step pick what they pick alone. A token's logprobs go out with the delta that gives out its
text (one whose text may begin a stop string waits with it); the tokens of a stop string are
left out, and a token that is partly answer and partly stop string is kept whole.

The memory of one step is bounded: it runs at most ``prefill_tokens`` tokens, and the model's
logits are kept for each sequence's last position alone, not for every prompt position.

model-config.yaml ``handler:`` may set ``dtype`` (``auto``: the folder's own on a GPU, float32
on the CPU; or ``float32``, ``bfloat16``, ``float16``), ``max_new_tokens`` (the default
``max_tokens``),
``max_prompt_tokens`` (a prompt's tokens; default the model's context),
``max_prompt_characters`` (a prompt's characters before it is tokenised, or of all its
messages; default 16 per token of ``max_prompt_tokens``), ``max_messages`` (default 1024) and
``prefill_tokens`` (the tokens one step runs: default 512 on the CPU, 2048 on a GPU),
``stream_step_tokens`` (the prompt tokens one step runs for each prompt in line while
sequences decode, up to ``prefill_tokens``: default 32 on the CPU, a quarter of
``prefill_tokens`` on a GPU, so that a long prompt's chunks stretch the streams' next tokens
less), ``stream_step_stretch`` (default 2: beside decoding sequences a step runs at least the
prompt tokens that make it take that many times a step of their decoding alone, as the engine
has timed them; 1 turns it off) and
``prefix_caching`` (default true; false computes every prompt in full, as vLLM's
``--no-enable-prefix-caching``); its top level ``kvCacheMemory`` (see ``paged_engine.kv_memory``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import torch

try:  # the archive's copies, beside this file (mservd and TorchServe put the model folder first)
    import constrained
    import logit_rules
    import logprobs
    import paged_engine
    import tool_calls
except ImportError:  # this repository's (tests that import the handler from the repository)
    from handlers import constrained, logit_rules, logprobs, paged_engine, tool_calls

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256
DEFAULT_PREFILL_TOKENS = {"cpu": 512, "cuda": 2048}  # tokens one step runs (prefill and decode)
# prompt tokens one step runs for each prompt in line while sequences decode: on the CPU 32,
# so that beside four short streams the clock's share (about 50 there) decides; 64 was more
# than that, so every chunk of a 1,500-token prompt beside them was 64 whatever it cost
# (BENCHMARKS.md, "Night 2026-12-07"); elsewhere a quarter of prefill_tokens
DEFAULT_STREAM_STEP_TOKENS = {"cpu": 32}
# ...and at least what makes a step take this many times a step of the decoding sequences
# alone: beside four short streams about 50, beside fifteen long ones about 200, so a
# mixed prompt's first token came in 3.4 s instead of 6.1-7.0 (in process, BENCHMARKS.md)
DEFAULT_STREAM_STEP_STRETCH = 2.0
DEFAULT_MAX_MESSAGES = 1024
CHARACTERS_PER_TOKEN = 16  # the default character bound, per token of max_prompt_tokens
READ_WAIT = 0.05  # seconds a step with nothing to decode waits for the requests being read
# seconds a step beside decoding streams waits for the requests that came with it: a short
# prompt is read in about a millisecond and then joins this step, not the next (a step of 16
# streams takes 100-150 ms on the CPU); a long one's templating and tokenising goes on meanwhile
JOIN_WAIT = 0.005
MAX_STOPS = 16
REPORT_INTERVAL = 0.5  # seconds between two reports of the KV cache's use, for /metrics
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_ROLE_CHARACTERS = 64
MAX_STOP_CHARACTERS = 256  # each stop string's: every token is matched against them
# Below it sampling is greedy: logits over 1e-40 overflow float32 to inf, and the sampler
# raises on what softmax makes of them (any temperature this low picks the likeliest token)
MIN_TEMPERATURE = 1e-4
MAX_TOP_LOGPROBS = 20  # alternatives of each token's logprobs (OpenAI's chat bound)


class CausalLM:
    """The handler. Its helper types are nested: TorchServe wants one class per handler file."""

    @dataclass
    class Sequence:
        """One request's generation: its settings, its tokens so far, and its text so far."""

        prompt_tokens: int
        max_tokens: int
        temperature: float
        top_p: float
        stop: list[str]
        ignore_eos: bool
        generator: torch.Generator | None
        generated: list[int] = field(default_factory=list)
        text: str = ""  # the generated tokens' text so far
        sent: int = 0  # how much of it the client has (the rest may begin a stop string)
        prefix_offset: int = 0  # the tokens decoded again with the new ones, for their spacing
        read_offset: int = 0  # the tokens whose text is in ``text``
        finish_reason: str | None = None
        # what shapes its picks (None: the model's logits as they are): logit_bias and
        # penalties, a grammar (structured output, a forced tool call)
        rules: logit_rules.LogitRules | None = None
        constraint: constrained.Constraint | None = None
        recorder: logprobs.Recorder | None = None  # the tokens' logprobs, when asked
        tools: CausalLM.Tools | None = None  # the answer read for tool calls

        @property
        def shaped(self) -> bool:
            return (self.rules is not None or self.constraint is not None
                    or self.recorder is not None)

    @dataclass
    class Tools:
        """A request's tools: its answer is read for calls; ``rest``: the grammar that follows
        a call the model opens unconstrained (``tool_choice: auto``), None once it applies."""

        parser: tool_calls.Parser
        rest: str | None = None

    class TextDelta(str):
        """The text one step added to a request's answer, with what a client may want to know."""

        # "stop" (EOS, a stop string, a grammar's end), "length", "tool_calls"; None: going on
        finish_reason: str | None = None
        prompt_tokens: int = 0
        completion_tokens: int = 0
        logprobs: list[dict[str, Any]] | None = None  # its tokens' (logprobs.py), when asked
        tool_calls: list[dict[str, Any]] | None = None  # OpenAI's deltas of its tool calls

        @classmethod
        def make(cls, text: str, seq: CausalLM.Sequence) -> CausalLM.TextDelta:
            delta = cls(text)
            delta.finish_reason = seq.finish_reason
            delta.prompt_tokens = seq.prompt_tokens
            delta.completion_tokens = len(seq.generated)
            return delta

    class Refused(ValueError):
        """A request the model cannot run (its prompt is longer than the context, a bad field)."""

    class Pending(str):
        """The output of a request still being read: no text yet, not finished."""

        finish_reason: str | None = None
        prompt_tokens: int = 0
        completion_tokens: int = 0

    def initialize(self, context: Any) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        properties = context.system_properties
        model_dir = properties.get("model_dir")
        gpu = properties.get("gpu_id")
        self.device = torch.device(f"cuda:{gpu}" if gpu is not None and torch.cuda.is_available()
                                   else "cpu")
        config = context.model_yaml_config or {}
        self.continuous = str(config.get("continuousBatching", "")).lower() == "true"
        handler_config = config.get("handler") or {}
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=model_dtype(str(handler_config.get("dtype", "auto")), self.device),
            attn_implementation="sdpa")  # the engine's attention on the CPU and on a GPU alike
        # transformers wraps `to` with functools.wraps, and typeshed's _Wrapped binds no self,
        # so mypy takes the device for the model
        self.model.to(self.device).eval()  # type: ignore[arg-type]
        self.default_max_tokens = int(handler_config.get("max_new_tokens", DEFAULT_MAX_TOKENS))
        self.context_length = int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.max_prompt_tokens = min(self.context_length, int(
            handler_config.get("max_prompt_tokens", self.context_length)))
        self.max_prompt_characters = int(handler_config.get(
            "max_prompt_characters", CHARACTERS_PER_TOKEN * self.max_prompt_tokens))
        self.max_messages = int(handler_config.get("max_messages", DEFAULT_MAX_MESSAGES))
        self.prefill_tokens = int(handler_config.get(
            "prefill_tokens", DEFAULT_PREFILL_TOKENS.get(self.device.type, 512)))
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.vocab_size = int(self.model.config.vocab_size)  # the logits' width
        self.vocabulary = logprobs.Vocabulary(self.tokenizer)
        self.grammars = constrained.Grammars(self.tokenizer, self.vocab_size)
        self.native_tools = tool_calls.knows_tools(self.tokenizer)
        budget = paged_engine.kv_budget(self.model, config.get("kvCacheMemory"), self.device)
        prefix_caching = str(handler_config.get("prefix_caching", True)).lower() != "false"
        stream_tokens = handler_config.get("stream_step_tokens",
                                           DEFAULT_STREAM_STEP_TOKENS.get(self.device.type))
        stretch = step_stretch(handler_config.get("stream_step_stretch",
                                                  DEFAULT_STREAM_STEP_STRETCH))
        self.engine = paged_engine.PagedEngine(
            self.model, budget, self.prefill_tokens, self.sample, prefix_caching,
            int(stream_tokens) if stream_tokens is not None else None, stretch)
        # new requests are read here, so that a long prompt's templating and tokenising
        # (the tokenizer's Rust code lets go of the GIL) do not hold up the running sequences
        self.reader = ThreadPoolExecutor(1, thread_name_prefix="causal-lm-read")
        self.reading: dict[str, Future] = {}  # request id -> (sequence, prompt ids), in order
        self.failed: dict[str, Any] = {}  # request id -> its error, until it leaves the batch
        self.sampling_failed: dict[str, Any] = {}  # request id -> its sampler's error, this step
        context.cache = {}
        self.sequences: dict[str, CausalLM.Sequence] = {}  # in the engine, not finished
        self.generated = 0  # tokens generated in the current step
        self.reported = 0.0  # when the KV cache's use was last reported

    # -- one step ------------------------------------------------------------------------

    def handle(self, data: list[Any], context: Any) -> list[Any]:
        ids = [context.request_ids[i] for i in range(len(data))]
        if self.continuous:
            return self.step(data, ids, context)
        return self.run_to_end(data, ids, context)

    def step(self, data: list[Any], ids: list[str], context: Any) -> list[Any]:
        """Start reading the requests seen for the first time, hand those read to the engine,
        then one step of the engine: a token for every decoding sequence, and prompts
        prefilled with what is left of the step's token budget."""
        cache = context.cache
        outputs: dict[str, Any] = {}
        self.forget((set(self.sequences) | set(self.reading) | set(self.failed)) - set(ids),
                    context)  # gone: finished, failed or cancelled
        fresh = []
        for rid, row in zip(ids, data):
            if rid not in cache and rid not in self.reading and rid not in self.failed:
                self.reading[rid] = self.reader.submit(self.read, row)
                fresh.append(self.reading[rid])
        if self.reading and not self.sequences:  # nothing else to do: wait for the reads
            wait(self.reading.values(), timeout=READ_WAIT)
        elif fresh:
            wait(fresh, timeout=JOIN_WAIT)
        self.admit(outputs, cache)
        if self.sequences:
            try:
                ran = self.engine.step()
            except Exception:  # the shared step: its sequences fail (the engine dropped them)
                self.sequences.clear()
                raise
            for rid, why in ran.failed.items():
                if self.sequences.pop(rid, None) is not None:
                    cache[rid].finish_reason = "error"
                    outputs[rid] = refusal(why, 503)
            for rid, error in self.sampling_failed.items():
                if self.sequences.pop(rid, None) is not None:
                    cache[rid].finish_reason = "error"
                    outputs[rid] = error
                    self.engine.cancel(rid)
            self.sampling_failed.clear()
            for rid, tokens in ran.tokens.items():
                seq = self.sequences.get(rid)
                if seq is not None:
                    outputs[rid] = self.take(seq, tokens, rid in ran.finished)
                    if seq.finish_reason is not None:  # EOS, length or a stop string
                        del self.sequences[rid]
                        self.engine.cancel(rid)  # a stop string: the engine would go on
        for rid, output in outputs.items():
            if not isinstance(output, (str, self.TextDelta)):  # its error, kept while it stays
                self.failed[rid] = output
        for rid in ids:  # still being read or waiting for room, or ended in an earlier step
            if rid not in outputs:
                outputs[rid] = (self.Pending() if rid in self.reading
                                else self.failed.get(rid) or self.TextDelta.make("", cache[rid]))
        context.stopping_criteria = [self.stopper(rid, cache, self.reading) for rid in ids]
        self.report(context)
        return [outputs[rid] for rid in ids]

    def report(self, context: Any) -> None:
        """This step's figures for /metrics, through TorchServe's metrics API (which adds the
        ModelName dimension itself): tokens generated, prefix tokens the cache gave back, and
        the KV cache's size and use in tokens (mservd also reads those two per worker)."""
        metrics = context.metrics
        if self.generated:
            metrics.add_counter("GeneratedTokens", self.generated)
            self.generated = 0
        now = time.monotonic()
        if now - self.reported < REPORT_INTERVAL and self.sequences:
            return  # (the step that ends the last sequence always reports: the cache is free)
        self.reported = now
        usage = self.engine.usage()
        if usage.reused_tokens:
            metrics.add_counter("PrefixCacheHitTokens", usage.reused_tokens)
        from ts.metrics.metric_type_enum import MetricTypes  # mservd's, or TorchServe's

        for name, value in (("KVCacheUsedTokens", usage.used_tokens),
                            ("KVCacheCapacityTokens", usage.capacity_tokens)):
            metrics.add_metric(name, value, "count", metric_type=MetricTypes.GAUGE)

    def admit(self, outputs: dict[str, Any], cache: dict[str, Any]) -> None:
        """Hand the read requests to the engine, in the order they came (it queues those the
        KV cache has no room for yet); a request that could not be read gets its error in
        ``outputs``."""
        for rid, future in list(self.reading.items()):
            if not future.done():
                continue
            del self.reading[rid]
            try:
                seq, prompt = future.result()
            except CausalLM.Refused as exc:
                outputs[rid] = refusal(str(exc))
                continue
            except Exception as exc:  # a tokenizer's or a template's own failure: this one's
                logger.error("request %s could not be read: %s", rid, exc, exc_info=exc)
                outputs[rid] = refusal(f"The request could not be read: "
                                       f"{type(exc).__name__}: {exc}", 500)
                continue
            cache[rid] = self.sequences[rid] = seq
            self.engine.add(rid, prompt.tolist(), seq.max_tokens,
                            [] if seq.ignore_eos else sorted(self.eos))

    def run_to_end(self, data: list[Any], ids: list[str], context: Any) -> list[Any]:
        """The whole batch to its end in this call, each step's deltas streamed as they come."""
        from ts.handler_utils.utils import send_intermediate_predict_response

        outputs = self.step(data, ids, context)
        while not all(stop(out) for stop, out in zip(context.stopping_criteria, outputs)):
            send_intermediate_predict_response(outputs, context.request_ids, "Intermediate "
                                               "Prediction success", 200, context)
            outputs = self.step(data, ids, context)
        self.forget(set(ids), context)
        return outputs

    @staticmethod
    def stopper(rid: str, cache: dict[str, Any], reading: dict[str, Any]):
        def finished(_output: Any) -> bool:
            if rid in reading:
                return False
            seq = cache.get(rid)
            return seq is None or seq.finish_reason is not None
        return finished

    # -- requests join and leave ---------------------------------------------------------

    def read(self, row: Any) -> tuple[CausalLM.Sequence, torch.Tensor]:
        """A request's sequence and prompt ids, from its row (on the reading thread)."""
        return self.sequence(parse_request(row))

    def sequence(self, request: dict[str, Any]) -> tuple[CausalLM.Sequence, torch.Tensor]:
        """A request's generation settings and its prompt's token ids.

        :raises CausalLM.Refused: a bad field, or a prompt and ``max_tokens`` past the context.
        """
        try:
            max_tokens = int(request.get("max_tokens") or self.default_max_tokens)
            temperature = float(request.get("temperature") or 0.0)
            top_p = request.get("top_p")
            top_p = 1.0 if top_p is None else float(top_p)  # 0 is refused below, not 1.0
            seed = request.get("seed")
            seed = None if seed is None else int(seed)
        except (TypeError, ValueError, OverflowError):
            raise CausalLM.Refused("max_tokens and seed must be integers, temperature and "
                                   "top_p numbers.") from None
        stop = request.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or len(stop) > MAX_STOPS or not all(
                isinstance(s, str) and len(s) <= MAX_STOP_CHARACTERS for s in stop):
            raise CausalLM.Refused(f'"stop" must be a string or a list of up to {MAX_STOPS} '
                                   f"strings, each of at most {MAX_STOP_CHARACTERS} characters.")
        if max_tokens < 1:
            raise CausalLM.Refused("max_tokens must be at least 1.")
        # a NaN, or a top_p of 0 or less, would make the sampler raise: in the decoding step
        # every running sequence shares, which would fail them all
        if not 0.0 <= temperature <= 2.0:
            raise CausalLM.Refused(f"temperature must be from 0 to 2, got {temperature}.")
        if not 0.0 < top_p <= 1.0:
            raise CausalLM.Refused(f"top_p must be above 0 and at most 1, got {top_p}.")
        prompt = self.encode_prompt(request)[0]
        if len(prompt) > self.max_prompt_tokens:
            raise CausalLM.Refused(
                f"The prompt has {len(prompt)} tokens; this model takes at most "
                f"{self.max_prompt_tokens} (handler.max_prompt_tokens).")
        if len(prompt) + max_tokens > self.context_length:
            raise CausalLM.Refused(
                f"The prompt has {len(prompt)} tokens; with max_tokens {max_tokens} that is "
                f"more than the model's context of {self.context_length} tokens.")
        if len(prompt) + max_tokens > self.engine.capacity:
            raise CausalLM.Refused(
                f"The prompt has {len(prompt)} tokens; with max_tokens {max_tokens} that is "
                f"more than the {self.engine.capacity} tokens this worker's KV cache holds "
                "(kvCacheMemory): send a shorter prompt or a smaller max_tokens.")
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed % 2**63)
        seq = self.Sequence(len(prompt), max_tokens, temperature, top_p, stop,
                            bool(request.get("ignore_eos")), generator)
        self.shape(seq, request)
        return seq, prompt

    def shape(self, seq: CausalLM.Sequence, request: dict[str, Any]) -> None:
        """What the request asks of its picks and its answer, beyond the sampler's settings:
        ``logit_bias`` and penalties, ``logprobs``, ``response_format``, ``tools``.

        :raises CausalLM.Refused: a field this model cannot serve, named in the message.
        """
        try:
            seq.rules = logit_rules.LogitRules.of(request, self.vocab_size)
        except logit_rules.RuleError as exc:
            raise CausalLM.Refused(str(exc)) from None
        top = logprob_count(request)
        if top is not None:
            seq.recorder = logprobs.Recorder(top)
        tools = request.get("tools") or []
        choice = request.get("tool_choice", "auto")
        parallel = request.get("parallel_tool_calls") is not False
        grammar, what = None, ""
        if tools and choice != "none":
            grammar, what = tool_calls.grammar(tools, choice, parallel), "tool_choice"
            seq.tools = self.Tools(tool_calls.Parser())
            if grammar is None:  # auto: constrained once the model opens a call
                seq.tools.rest = tool_calls.rest_of_call(tools, parallel)
                self.constraint(seq.tools.rest, "tools")  # refused now if it cannot be
        response_format = request.get("response_format")
        if response_format is not None:
            if seq.tools is not None and grammar is None:
                raise CausalLM.Refused(
                    '"response_format" with "tools" is served with "tool_choice" "none", '
                    '"required" or a named function, not "auto": the answer is either '
                    "constrained to the format from its first token or free to call a tool.")
            if grammar is None:
                grammar, what = format_grammar(response_format), "response_format"
        if grammar is not None:
            seq.constraint = self.constraint(grammar, what)

    def constraint(self, grammar: str, what: str) -> constrained.Constraint:
        try:
            return self.grammars.constraint(grammar, what)
        except constrained.GrammarError as exc:
            raise CausalLM.Refused(str(exc)) from None

    def forget(self, gone: set[str], context: Any) -> None:
        """Drop finished or cancelled sequences from the engine (their blocks are freed) and
        from context.cache, and requests cancelled while they were being read."""
        for rid in gone:
            context.cache.pop(rid, None)
            self.failed.pop(rid, None)
            self.sampling_failed.pop(rid, None)
            reading = self.reading.pop(rid, None)
            if reading is not None:
                reading.cancel()
            if self.sequences.pop(rid, None) is not None:
                self.engine.cancel(rid)

    # -- decoding ----------------------------------------------------------------------

    def sample(self, rid: str, logits: torch.Tensor) -> int:
        """The engine's sampler: the next token of ``rid``, picked with its own settings. A
        failure (a sampler's) ends this sequence alone with the error, after the step."""
        try:
            seq = self.sequences[rid]
            return self.shape_and_pick(seq, logits) if seq.shaped else self.pick(seq, logits)
        except Exception as exc:
            logger.error("request %s: picking its next token failed: %s", rid, exc,
                         exc_info=exc)
            self.sampling_failed[rid] = refusal(
                f"Picking the next token failed: {type(exc).__name__}: {exc}", 500)
            return 0  # never shown: the sequence ends with its error

    def take(self, seq: CausalLM.Sequence, tokens: list[int],
             ended: bool) -> CausalLM.TextDelta:
        """The text the engine's new tokens for ``seq`` add (one a step, but after all), and
        whether they end it; ``ended``: the engine has ended it (its own EOS or length check,
        which agree with :meth:`advance`'s)."""
        text = ""
        for token in tokens:
            if seq.finish_reason is None:
                text += self.advance(seq, token)
        if ended and seq.finish_reason is None:
            seq.finish_reason = "length"
            text += release(seq, len(seq.text))
        return self.delta(seq, text)

    def delta(self, seq: CausalLM.Sequence, text: str) -> CausalLM.TextDelta:
        """What a step gives the client of ``seq``: the text it released, with the logprobs
        of the tokens whose text is now out and the tool calls read in it."""
        finished = seq.finish_reason is not None
        calls = None
        if seq.tools is not None:
            text, calls = seq.tools.parser.feed(text, finished)
        delta = self.TextDelta.make(text, seq)
        if seq.recorder is not None:
            pending = seq.recorder.pending
            out = len(pending) if finished else next(
                (i for i, e in enumerate(pending) if e.end > seq.sent), len(pending))
            delta.logprobs = [self.vocabulary.entry(e) for e in pending[:out]]
            del pending[:out]
        if seq.tools is not None:
            delta.tool_calls = calls or None
            if seq.finish_reason == "stop" and seq.tools.parser.calls:
                delta.finish_reason = "tool_calls"
        return delta

    def advance(self, seq: CausalLM.Sequence, token: int) -> CausalLM.TextDelta:
        """Say what text the next token adds and whether the sequence ends.

        The text a stop string ends is cut exactly before it, even where the string spans
        tokens: text that may begin a stop string is held back until the next tokens say
        whether it does."""
        entry = seq.recorder.pending[-1] if seq.recorder and seq.recorder.pending else None
        if token in self.eos and not seq.ignore_eos:
            if entry is not None:  # the end is no token of the answer
                seq.recorder.pending.pop()  # type: ignore[union-attr]
            seq.finish_reason = "stop"
            return self.TextDelta.make(release(seq, len(seq.text)), seq)
        seq.generated.append(token)
        self.generated += 1
        last = len(seq.generated) >= seq.max_tokens
        checked = max(0, seq.sent - max((len(stop) for stop in seq.stop), default=0))
        start = len(seq.text)
        seq.text += self.detokenize(seq, last)
        if entry is not None:
            entry.start, entry.end = start, len(seq.text)
        at = min((found for stop in seq.stop if stop
                  if (found := seq.text.find(stop, checked)) >= 0), default=-1)
        if at >= 0:
            seq.text = seq.text[:at]
            seq.finish_reason = "stop"
            if seq.recorder is not None:  # the stop string's own tokens are no answer's
                seq.recorder.pending = [e for e in seq.recorder.pending if e.start < at]
            return self.TextDelta.make(release(seq, at), seq)
        if seq.constraint is not None and seq.constraint.done:  # the grammar's text is whole
            seq.finish_reason = "stop"
            return self.TextDelta.make(release(seq, len(seq.text)), seq)
        if seq.tools is not None and seq.tools.rest is not None:
            self.constrain_call(seq)
        if last:
            seq.finish_reason = "length"
            return self.TextDelta.make(release(seq, len(seq.text)), seq)
        return self.TextDelta.make(release(seq, len(seq.text) - held(seq.text, seq.stop)), seq)

    def detokenize(self, seq: CausalLM.Sequence, last: bool) -> str:
        """The text the newest tokens add, decoding a few tokens, not the whole answer: the
        tokens decoded last time, again with the new ones, for the spacing between them
        (vLLM's incremental detokenisation). Half of a character waits for the rest of its
        bytes, unless ``last``."""
        tokens = seq.generated
        before = self.text_of(tokens[seq.prefix_offset:seq.read_offset])
        now = self.text_of(tokens[seq.prefix_offset:])
        if len(now) > len(before) and (last or not now.endswith("\ufffd")):
            seq.prefix_offset, seq.read_offset = seq.read_offset, len(tokens)
            return now[len(before):]
        return ""

    def text_of(self, ids: list[int]) -> str:
        """The text of one sequence of token ids, special tokens left out."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        # decode is typed str | list[str]: a list for a batch of sequences, never for one
        assert isinstance(text, str), "one sequence of ids decodes to one string"
        return text

    def shape_and_pick(self, seq: CausalLM.Sequence, logits: torch.Tensor) -> int:
        """The next token of a sequence whose request shapes its picks: its bias and penalties,
        then its grammar's mask, then :meth:`pick`; its logprobs are those of the
        distribution it was picked from (before ``top_p``: ``logprobs.py``)."""
        if seq.rules is not None:
            logits = seq.rules.apply(logits)
        if seq.constraint is not None:
            logits = seq.constraint.mask(logits)
        token = self.pick(seq, logits)
        if seq.recorder is not None:
            scale = seq.temperature if seq.temperature >= MIN_TEMPERATURE else 1.0
            seq.recorder.record(logits / scale, token)
        if seq.rules is not None:
            seq.rules.observe(token)
        if seq.constraint is not None:
            seq.constraint.accept(token)
        return token

    def constrain_call(self, seq: CausalLM.Sequence) -> None:
        """``tool_choice: auto``: once the answer opens a tool call, what follows is
        constrained to one (a declared function's name, arguments of its schema)."""
        assert seq.tools is not None and seq.tools.rest is not None
        at = seq.text.find(tool_calls.OPEN)
        if at < 0:
            return
        rest, seq.tools.rest = seq.tools.rest, None
        constraint = self.grammars.constraint(rest, "tools")
        # the text the token that opened the call brought past it: the grammar's to follow
        after = seq.text[at + len(tool_calls.OPEN):]
        try:
            for token in self.tokenizer.encode(after, add_special_tokens=False):
                constraint.accept(token)
        except constrained.GrammarError:  # not a call the grammar allows: left unconstrained
            return
        seq.constraint = constraint

    @staticmethod
    def pick(seq: CausalLM.Sequence, logits: torch.Tensor) -> int:
        if seq.temperature < MIN_TEMPERATURE:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits.float() / seq.temperature, dim=-1)
        if seq.top_p < 1.0:
            ordered, order = torch.sort(probs, descending=True)
            beyond = torch.cumsum(ordered, dim=-1) - ordered > seq.top_p
            ordered[beyond] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, ordered)
        return int(torch.multinomial(probs, 1, generator=seq.generator))

    def encode_prompt(self, request: dict[str, Any]) -> torch.Tensor:
        """The prompt's token ids, its size checked before it is templated or tokenised."""
        messages = request.get("messages")
        tools = None
        if isinstance(messages, list) and all(isinstance(m, dict) for m in messages) and (
                request.get("tools") or any(m.get("role") == "tool" or m.get("tool_calls")
                                            for m in messages)):
            offered = request.get("tools") if request.get("tool_choice") != "none" else None
            messages, tools = tool_calls.render(messages, offered, self.native_tools)
        if messages is not None:
            if not isinstance(messages, list) or not all(
                    isinstance(m, dict) and isinstance(m.get("content", ""), str)
                    and len(str(m.get("role", ""))) <= MAX_ROLE_CHARACTERS for m in messages):
                raise CausalLM.Refused('"messages" must be a list of {"role", "content"}, each '
                                       f"role of at most {MAX_ROLE_CHARACTERS} characters.")
            if len(messages) > self.max_messages:
                raise CausalLM.Refused(f'"messages" has {len(messages)} messages; this model '
                                       f"takes at most {self.max_messages} "
                                       "(handler.max_messages).")
            self.check_characters(sum(len(value) for m in messages for value in m.values()
                                      if isinstance(value, str)))
            try:
                encoded = self.tokenizer.apply_chat_template(
                    messages, tools=tools, add_generation_prompt=True, return_tensors="pt")
            except Exception as exc:  # the template's own complaint (a role it does not know)
                raise CausalLM.Refused(f"The messages do not fit the model's chat template: "
                                       f"{exc}") from None
            ids: torch.Tensor
            if isinstance(encoded, torch.Tensor):  # transformers 4: the ids alone
                ids = encoded
            else:  # transformers 5: a BatchEncoding (tokenize and return_dict are its defaults)
                assert isinstance(encoded, Mapping), "a tokenized template is ids or a dict"
                ids = encoded["input_ids"]
        elif "prompt_token_ids" in request and "prompt" not in request:
            ids = self.token_ids(request["prompt_token_ids"])
        else:
            prompt = request.get("prompt")
            if not isinstance(prompt, str) or not prompt:
                raise CausalLM.Refused('Send a non-empty "prompt" string or "messages".')
            self.check_characters(len(prompt))
            ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]
        return ids

    def token_ids(self, given: Any) -> torch.Tensor:
        """A prompt sent as token ids (``prompt_token_ids``), as a batch of one."""
        if not isinstance(given, list) or not given or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in given):
            raise CausalLM.Refused('"prompt_token_ids" must be a non-empty list of token ids.')
        if len(given) > self.max_prompt_tokens:
            raise CausalLM.Refused(
                f"The prompt has {len(given)} tokens; this model takes at most "
                f"{self.max_prompt_tokens} (handler.max_prompt_tokens).")
        wrong = next((t for t in given if not 0 <= t < self.vocab_size), None)
        if wrong is not None:
            raise CausalLM.Refused(f'"prompt_token_ids" has {wrong}, which is not a token of '
                                   f"this model's vocabulary of {self.vocab_size} tokens.")
        return torch.tensor([given], dtype=torch.long)

    def check_characters(self, count: int) -> None:
        if count > self.max_prompt_characters:
            raise CausalLM.Refused(
                f"The prompt has {count} characters; this model takes at most "
                f"{self.max_prompt_characters} (handler.max_prompt_characters), and at most "
                f"{self.max_prompt_tokens} tokens.")


def model_dtype(setting: str, device: torch.device) -> Any:
    """The weights' dtype for model-config.yaml ``handler.dtype``: ``auto`` (the default) is
    the folder's own on a GPU (its config's ``dtype``: bf16 or fp16 as users serve them) and
    float32 on the CPU, where half precision is slower; or ``float32``, ``bfloat16``,
    ``float16``."""
    if setting == "auto":
        return "auto" if device.type == "cuda" else torch.float32
    if setting not in DTYPES:
        raise ValueError(f"handler.dtype {setting!r} is not one of auto, "
                         f"{', '.join(DTYPES)}.")
    return DTYPES[setting]


def step_stretch(setting: Any) -> float:
    """model-config.yaml ``handler: stream_step_stretch``: a number, at least 1.

    :raises ValueError: anything else.
    """
    try:
        stretch = float(setting)
    except (TypeError, ValueError):
        stretch = 0.0
    if not stretch >= 1:  # (NaN too)
        raise ValueError(f"handler.stream_step_stretch {setting!r} is not a number of at least 1 "
                         "(how many times a step of the decoding sequences alone a step beside "
                         "them may take to prefill prompts; 1: no more than its token share)")
    return stretch


def logprob_count(request: dict[str, Any]) -> int | None:
    """How many alternatives each token's logprobs list, or None when none are asked for:
    chat's ``logprobs: true`` with ``top_logprobs`` (0 to 20), completions' ``logprobs`` (an
    integer, 0 to 5)."""
    asked = request.get("logprobs")
    if asked is None or asked is False:
        return None
    if asked is True:
        top = request.get("top_logprobs") or 0
    else:
        top = asked
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise CausalLM.Refused(f'"logprobs" and "top_logprobs" ask for 0 to '
                               f"{MAX_TOP_LOGPROBS} alternatives of each token, got {top!r}.")
    return top


def format_grammar(response_format: Any) -> str:
    """The grammar of ``response_format``: any JSON object, or JSON valid against a schema."""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_object":
        return constrained.json_schema_grammar({"type": "object"})
    schema = (response_format.get("json_schema") or {}).get("schema") if kind == (
        "json_schema") else None
    if not isinstance(schema, dict):
        raise CausalLM.Refused('"response_format" must be {"type": "json_object"} or '
                               '{"type": "json_schema", "json_schema": {"schema": {...}}}.')
    return constrained.json_schema_grammar(schema)


def release(seq: CausalLM.Sequence, upto: int) -> str:
    """The text from what the client has up to ``upto``, now the client's."""
    delta = seq.text[seq.sent:upto]
    seq.sent = max(seq.sent, upto)
    return delta


def held(text: str, stops: list[str]) -> int:
    """How many characters at the end of ``text`` may be the start of a stop string."""
    most = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), most, -1):  # the longest first
            if text.endswith(stop[:k]):
                most = k
                break
    return most


def parse_request(row: Any) -> dict[str, Any]:
    """A request's fields from its row: a JSON body (as a dict, or bytes), or plain text."""
    body = row.get("body", row.get("data")) if isinstance(row, dict) else row
    if isinstance(body, (bytes, bytearray)):
        text = bytes(body).decode("utf-8", "replace")
        try:
            body = json.loads(text)
        except RecursionError:  # "[[[[..." deeper than the parser goes: refused, not a prompt
            raise CausalLM.Refused("The JSON body is nested too deeply to parse.") from None
        except ValueError:
            body = text
    if isinstance(body, str):
        return {"prompt": body}
    if not isinstance(body, dict):
        raise CausalLM.Refused('The body must be JSON {"prompt": ...} or {"messages": [...]}.')
    return body


def refusal(message: str, status: int = 400) -> Any:
    """A request's own error: mservd's RequestError, else (on TorchServe) the message."""
    try:
        from handlers.errors import RequestError
    except ImportError:
        return message
    return RequestError(status, message, "BadRequestException" if status < 500
                        else "InternalServerException")
