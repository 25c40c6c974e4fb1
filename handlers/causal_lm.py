"""Text generation with a transformers causal LM, one decoding step per call (continuous batching).

Written the way TorchServe's continuous-batching handlers are, so the same file runs on
TorchServe 0.12 (it imports nothing of mservd): with ``continuousBatching: true`` in
model-config.yaml the server calls :meth:`CausalLM.handle` once per step with every running
request (new ones first appear with their body); each call prefills the new requests, runs one
batched decoding step for all of them, and returns one text delta per request.
``context.stopping_criteria`` tells the server which are finished; their state leaves
``context.cache`` and the slot is free for the next request. Without ``continuousBatching`` one
call runs its batch to the end, streaming each step's deltas with
``send_intermediate_predict_response``.

The sequences share one KV cache (transformers' ``DynamicCache``), left-padded to a common
length with an attention mask; a joining sequence is prefilled alone and padded in, a leaving
one is dropped from it. Greedy output is the tokens ``generate()`` gives for that prompt alone.

A request body is JSON: ``{"prompt": "..."}`` or ``{"messages": [{"role", "content"}, ...]}``
(through the tokenizer's chat template), with ``max_tokens``, ``temperature``, ``top_p``,
``seed``, ``stop`` (a string or a list) and ``ignore_eos``; a plain text body is the prompt.

What a request sends fails that request alone, never the others of the step: a new request
is read (parsed, its size checked, templated and tokenised) on a thread of its own while the
running sequences go on decoding, and joins at the first step after it is read; a body that
cannot be read, a prompt too long, a failing prefill or a failing sampler answers its own
requests with an error. Only a failure of the shared decoding step fails the step's
sequences (and never the worker).

The memory of one step is bounded: a step prefills new prompts together only while their
padded tokens fit ``prefill_tokens`` (one prompt at the least, so at most
``max(prefill_tokens, max_prompt_tokens)`` tokens), and the model's logits are kept for each
sequence's last position alone (``logits_to_keep``), not for every prompt position.

model-config.yaml ``handler:`` may set ``dtype`` (``auto``: the folder's own on a GPU, float32
on the CPU; or ``float32``, ``bfloat16``, ``float16``), ``max_new_tokens`` (the default
``max_tokens``),
``max_prompt_tokens`` (a prompt's tokens; default the model's context),
``max_prompt_characters`` (a prompt's characters before it is tokenised, or of all its
messages; default 16 per token of ``max_prompt_tokens``), ``max_messages`` (default 1024) and
``prefill_tokens`` (default 2048).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256
DEFAULT_PREFILL_TOKENS = 2048  # padded prompt tokens one step may prefill (one prompt at least)
DEFAULT_MAX_MESSAGES = 1024
CHARACTERS_PER_TOKEN = 16  # the default character bound, per token of max_prompt_tokens
READ_WAIT = 0.05  # seconds a step with nothing to decode waits for a request being read
MAX_STOPS = 16
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_ROLE_CHARACTERS = 64
MAX_STOP_CHARACTERS = 256  # each stop string's: every token is matched against them
# Below it sampling is greedy: logits over 1e-40 overflow float32 to inf, and the sampler
# raises on what softmax makes of them (any temperature this low picks the likeliest token)
MIN_TEMPERATURE = 1e-4


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
        next_token: int = 0  # the token the next decoding step feeds in
        position: int = 0  # its position

    class TextDelta(str):
        """The text one step added to a request's answer, with what a client may want to know."""

        finish_reason: str | None = None  # "stop" (EOS, a stop string), "length"; None: going on
        prompt_tokens: int = 0
        completion_tokens: int = 0

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
            model_dir, dtype=model_dtype(str(handler_config.get("dtype", "auto")), self.device))
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
        self.prefill_tokens = int(handler_config.get("prefill_tokens", DEFAULT_PREFILL_TOKENS))
        # new requests are read here, so that a long prompt's templating and tokenising
        # (the tokenizer's Rust code lets go of the GIL) do not hold up the running sequences
        self.reader = ThreadPoolExecutor(1, thread_name_prefix="causal-lm-read")
        self.reading: dict[str, Future] = {}  # request id -> (sequence, prompt ids), in order
        self.failed: dict[str, Any] = {}  # request id -> its error, until it leaves the batch
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.pad_id = self.tokenizer.pad_token_id or 0
        context.cache = {}
        self.rows: list[str] = []  # request id of each row of the shared cache
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # (rows, cached length): 0 where padded
        self.generated = 0  # tokens generated in the current step

    # -- one step ------------------------------------------------------------------------

    def handle(self, data: list[Any], context: Any) -> list[Any]:
        ids = [context.request_ids[i] for i in range(len(data))]
        if self.continuous:
            return self.step(data, ids, context)
        return self.run_to_end(data, ids, context)

    def step(self, data: list[Any], ids: list[str], context: Any) -> list[Any]:
        """Start reading the requests seen for the first time, prefill those read (under the
        step's token budget), then one decoding step for every running sequence (a
        just-prefilled one too, when others needed the step)."""
        cache = context.cache
        outputs: dict[str, Any] = {}
        self.forget((set(self.rows) | set(self.reading) | set(self.failed)) - set(ids),
                    context)  # gone: finished, failed or cancelled
        for rid, row in zip(ids, data):
            if rid not in cache and rid not in self.reading and rid not in self.failed:
                self.reading[rid] = self.reader.submit(self.read, row)
        if self.reading and not self.decoding(cache):  # nothing else to do: wait for a read
            wait(self.reading.values(), timeout=READ_WAIT, return_when=FIRST_COMPLETED)
        joining = self.admit(outputs)
        if joining:
            outputs.update(self.prefill(joining, cache))
        if any(rid not in outputs for rid in self.decoding(cache)):
            try:
                decoded = self.decode(cache)
            except Exception:  # the shared step: its sequences fail, their cache goes
                self.cache, self.mask, self.rows = None, None, []
                raise
            for rid, delta in decoded.items():
                before = outputs.get(rid)
                outputs[rid] = (self.TextDelta.make(before + delta, cache[rid])
                                if isinstance(before, self.TextDelta) and before else delta)
        for rid, output in outputs.items():
            if not isinstance(output, (str, self.TextDelta)):  # its error, kept while it stays
                self.failed[rid] = output
        for rid in ids:  # still being read, or ended in an earlier step of a static batch
            if rid not in outputs:
                outputs[rid] = (self.Pending() if rid in self.reading
                                else self.failed.get(rid) or self.TextDelta.make("", cache[rid]))
        context.stopping_criteria = [self.stopper(rid, cache, self.reading) for rid in ids]
        if self.generated:  # the tokens of this step, for /metrics: TorchServe's metrics API,
            # which adds the ModelName dimension itself (its dimensions are Dimension objects)
            context.metrics.add_counter("GeneratedTokens", self.generated)
            self.generated = 0
        return [outputs[rid] for rid in ids]

    def decoding(self, cache: dict[str, Any]) -> list[str]:
        """The running sequences not yet finished."""
        return [rid for rid in self.rows if cache[rid].finish_reason is None]

    def admit(self, outputs: dict[str, Any]) -> list[tuple[str, Any, torch.Tensor]]:
        """The read requests that join this step, in the order they came, while their prompts
        padded to the longest fit the step's ``prefill_tokens`` (the first always joins); a
        request that could not be read gets its error in ``outputs``. One still being read
        holds up none read after it."""
        joining: list[tuple[str, Any, torch.Tensor]] = []
        width = 0
        for rid, future in list(self.reading.items()):
            if not future.done():
                continue
            try:
                seq, prompt = future.result()
            except CausalLM.Refused as exc:
                outputs[rid] = refusal(str(exc))
                del self.reading[rid]
                continue
            except Exception as exc:  # a tokenizer's or a template's own failure: this one's
                logger.error("request %s could not be read: %s", rid, exc, exc_info=exc)
                outputs[rid] = refusal(f"The request could not be read: "
                                       f"{type(exc).__name__}: {exc}", 500)
                del self.reading[rid]
                continue
            wider = max(width, len(prompt))
            if joining and wider * (len(joining) + 1) > self.prefill_tokens:
                break
            width = wider
            joining.append((rid, seq, prompt))
            del self.reading[rid]
        return joining

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

    def prefill(self, joining: list[tuple[str, Any, torch.Tensor]],
                cache: dict[str, Any]) -> dict[str, Any]:
        """Run the joining prompts through the model together (left-padded to one length),
        then join them to the shared cache: each one's first token. A failure here is theirs
        alone: each gets the error, the running sequences go on."""
        from transformers import DynamicCache

        width = max(len(prompt) for _, _, prompt in joining)
        input_ids = torch.full((len(joining), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(joining), width), dtype=torch.long)
        for i, (_, _, prompt) in enumerate(joining):
            input_ids[i, width - len(prompt):] = prompt
            mask[i, width - len(prompt):] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        own = DynamicCache()
        try:
            with torch.inference_mode():
                logits = self.model(input_ids, attention_mask=mask, position_ids=positions,
                                    past_key_values=own, use_cache=True,
                                    logits_to_keep=1).logits[:, -1, :]
        except Exception as exc:  # out of memory, say: the joining requests fail, alone
            logger.error("prefill of %d prompts (%d tokens each, padded) failed: %s",
                         len(joining), width, exc, exc_info=exc)
            message = f"The prompt could not be prefilled: {type(exc).__name__}: {exc}"
            return {rid: refusal(message, 500) for rid, _, _ in joining}
        self.join([rid for rid, _, _ in joining], own, mask)
        outputs: dict[str, Any] = {}
        for i, (rid, seq, prompt) in enumerate(joining):
            seq.position = len(prompt)
            cache[rid] = seq
            outputs[rid] = self.advance_alone(rid, seq, logits[i])
        return outputs

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
        generator = None
        if seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(seed % 2**63)
        seq = self.Sequence(len(prompt), max_tokens, temperature, top_p, stop,
                            bool(request.get("ignore_eos")), generator)
        return seq, prompt

    def join(self, rids: list[str], own: Any, mask: torch.Tensor) -> None:
        """Pad the joining sequences' cache and the shared one to one length, and stack them."""
        if self.cache is None or not self.rows:
            self.cache, self.mask, self.rows = own, mask, list(rids)
            return
        assert self.mask is not None, "the shared cache has its mask"
        width = max(self.mask.shape[1], mask.shape[1])
        for mine, theirs in zip(own.layers, self.cache.layers):
            theirs.keys = torch.cat([left_pad(theirs.keys, width), left_pad(mine.keys, width)])
            theirs.values = torch.cat([left_pad(theirs.values, width),
                                       left_pad(mine.values, width)])
        self.mask = torch.cat([left_pad(self.mask, width), left_pad(mask, width)])
        self.rows.extend(rids)

    def forget(self, gone: set[str], context: Any) -> None:
        """Drop finished or cancelled sequences from the shared cache and from context.cache,
        and requests cancelled while they were being read."""
        for rid in gone:
            context.cache.pop(rid, None)
            self.failed.pop(rid, None)
            reading = self.reading.pop(rid, None)
            if reading is not None:
                reading.cancel()
        if not gone & set(self.rows):
            return
        keep = [i for i, rid in enumerate(self.rows) if rid not in gone]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache, self.mask = None, None
            return
        assert self.mask is not None, "rows are running: the shared cache has its mask"
        index = torch.tensor(keep, device=self.device)
        self.mask = self.mask[index]
        drop = int((self.mask.sum(dim=0) == 0).long().cumprod(0).sum())  # all-padding columns
        self.mask = self.mask[:, drop:]
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, drop:]
            layer.values = layer.values[index, :, drop:]

    # -- decoding ----------------------------------------------------------------------

    def decode(self, cache: dict[str, Any]) -> dict[str, CausalLM.TextDelta]:
        """One batched step over the shared cache; every unfinished sequence gets a token."""
        rows = self.rows
        assert self.mask is not None, "step decodes only while rows are running"
        tokens = torch.tensor([[cache[r].next_token] for r in rows], device=self.device)
        positions = torch.tensor([[cache[r].position] for r in rows], device=self.device)
        self.mask = torch.cat([self.mask, torch.ones((len(rows), 1), dtype=torch.long,
                                                      device=self.device)], dim=1)
        with torch.inference_mode():
            logits = self.model(tokens, attention_mask=self.mask, position_ids=positions,
                                past_key_values=self.cache, use_cache=True,
                                logits_to_keep=1).logits[:, -1, :]
        out = {}
        for i, rid in enumerate(rows):
            seq = cache[rid]
            if seq.finish_reason is None:
                seq.position += 1
                out[rid] = self.advance_alone(rid, seq, logits[i])
        return out

    def advance_alone(self, rid: str, seq: CausalLM.Sequence, logits: torch.Tensor) -> Any:
        """:meth:`advance`, whose failure (a sampler's, a tokenizer's) ends this sequence
        alone with the error."""
        try:
            return self.advance(rid, seq, logits)
        except Exception as exc:
            logger.error("request %s: picking its next token failed: %s", rid, exc,
                         exc_info=exc)
            seq.finish_reason = "error"
            return refusal(f"Picking the next token failed: {type(exc).__name__}: {exc}", 500)

    def advance(self, rid: str, seq: CausalLM.Sequence,
                logits: torch.Tensor) -> CausalLM.TextDelta:
        """Pick the next token, and say what text it adds and whether the sequence ends.

        The text a stop string ends is cut exactly before it, even where the string spans
        tokens: text that may begin a stop string is held back until the next tokens say
        whether it does."""
        token = self.pick(seq, logits)
        seq.next_token = token
        if token in self.eos and not seq.ignore_eos:
            seq.finish_reason = "stop"
            return self.TextDelta.make(release(seq, len(seq.text)), seq)
        seq.generated.append(token)
        self.generated += 1
        last = len(seq.generated) >= seq.max_tokens
        checked = max(0, seq.sent - max((len(stop) for stop in seq.stop), default=0))
        seq.text += self.detokenize(seq, last)
        at = min((found for stop in seq.stop if stop
                  if (found := seq.text.find(stop, checked)) >= 0), default=-1)
        if at >= 0:
            seq.text = seq.text[:at]
            seq.finish_reason = "stop"
            return self.TextDelta.make(release(seq, at), seq)
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
                    messages, add_generation_prompt=True, return_tensors="pt")
            except Exception as exc:  # the template's own complaint (a role it does not know)
                raise CausalLM.Refused(f"The messages do not fit the model's chat template: "
                                       f"{exc}") from None
            ids: torch.Tensor
            if isinstance(encoded, torch.Tensor):  # transformers 4: the ids alone
                ids = encoded
            else:  # transformers 5: a BatchEncoding (tokenize and return_dict are its defaults)
                assert isinstance(encoded, Mapping), "a tokenized template is ids or a dict"
                ids = encoded["input_ids"]
        else:
            prompt = request.get("prompt")
            if not isinstance(prompt, str) or not prompt:
                raise CausalLM.Refused('Send a non-empty "prompt" string or "messages".')
            self.check_characters(len(prompt))
            ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]
        return ids

    def check_characters(self, count: int) -> None:
        if count > self.max_prompt_characters:
            raise CausalLM.Refused(
                f"The prompt has {count} characters; this model takes at most "
                f"{self.max_prompt_characters} (handler.max_prompt_characters), and at most "
                f"{self.max_prompt_tokens} tokens.")


def left_pad(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """``tensor`` with zeros added before its sequence dimension (the last for a mask, the
    third for keys and values) up to ``width``."""
    dim = 1 if tensor.dim() == 2 else 2
    missing = width - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


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
