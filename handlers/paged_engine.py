"""The causal LM's engine: transformers' continuous batching driven one step per call.

transformers (5.25) ships a continuous-batching engine: a paged KV cache of fixed size (blocks
of ``page_size`` tokens), a FIFO scheduler that queues a request while its blocks do not fit
and preempts a running one that cannot grow (its blocks are freed and it is recomputed later
from its prompt and the tokens it had), prefix reuse (a full block is hashed with the blocks
before it, and a later prompt that begins with the same tokens shares it instead of computing
it again), and chunked prefill under a per-step token budget (decoding sequences go first,
then as much of a prompt as the budget leaves). Its public API runs all of that on a thread of
its own; :class:`PagedEngine` runs it here, one step per call and no thread, through the batch
processor's ``prepare_next_batch`` / ``_generation_step`` / ``update_batch``, with changes of
its own: the step's token budget shrinks while sequences decode (``streaming_batch_tokens``
of prompt for each prompt in line, or what stretches their step by ``step_stretch`` as the
:class:`StepClock` has timed it: :meth:`PagedEngine.step_tokens`), a prompt is prefilled
beside them while a block is free for each sequence rather than 15 % of the cache
(:meth:`PagedEngine.margin`), each sequence attends to its own keys alone
(:func:`varlen_sdpa`; decoding ones of like lengths in one call) instead of the whole
step under a mask, read from the cache where they lie rather than from a copy of the step's
every key (:func:`read_keys_in_place`), and cached prefix blocks are evicted least recently
used first, only as many as a step needs room for (:class:`LeastRecentlyUsed`), not all at
once. Those names are semi-private and
change between minor versions: pyproject.toml pins ``transformers==5.25.*`` and
``tests/unit/test_paged_engine.py`` fails loudly when an upgrade breaks them.

The engine owns the KV cache and who runs in a step. It does not read requests, pick tokens
(the caller's ``pick`` does, for each sequence that gets one: its sampling settings and seed
are the caller's), turn tokens into text or decide that a stop string ended a sequence.
Like the handler that uses it, it imports nothing of mservd: it travels in the archive beside
``causal_lm.py`` so that the archive runs on TorchServe too.
"""

from __future__ import annotations

import logging
import math
import queue
import re
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_MEMORY = 512 * 2**20  # bytes: the CPU has no free memory of its own to share
DEFAULT_CUDA_KV_FRACTION = 0.5  # of the GPU's free memory once the weights are loaded
CPU_PAGE_SIZE = 32  # tokens per block: the granularity of prefix reuse
CUDA_PAGE_SIZE = 64
NO_ROOM = "No requests can be scheduled"  # transformers' words when the cache holds none
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
MEMORY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*", re.IGNORECASE)


@dataclass(frozen=True)
class KVBudget:
    """The KV cache's size: what one token costs, how many bytes it may take, in blocks."""

    bytes_per_token: int
    budget: int  # bytes
    page_size: int  # tokens per block
    num_blocks: int

    @property
    def tokens(self) -> int:
        return self.num_blocks * self.page_size


@dataclass(frozen=True)
class CacheUsage:
    """The KV cache in tokens: what it holds, what running sequences hold of it, and the prompt
    tokens found in it (prefix reuse) since the last look."""

    capacity_tokens: int
    used_tokens: int  # blocks held by sequences (a shared block once), in tokens
    reused_tokens: int


@dataclass
class EngineStep:
    """What one step did: each sequence's new tokens, and the sequences the engine ended."""

    tokens: dict[str, list[int]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # request id -> why; gone from the engine
    finished: set[str] = field(default_factory=set)  # ended by the engine: EOS or max tokens
    scheduled: dict[str, int] = field(default_factory=dict)  # request id -> tokens it ran


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """One token's keys and values in every layer: 2 × layers × KV heads × head dim × bytes
    per element (a model with grouped KV heads keeps fewer heads than it attends with)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * dtype.itemsize


def kv_memory(setting: Any, device: torch.device) -> int:
    """The bytes the KV cache may take, from model-config.yaml ``kvCacheMemory``: bytes (an
    int, or a string with a unit: ``512MiB``, ``2GiB``, ``1.5GB``), or on a GPU a fraction
    (0 < x ≤ 1) of its free memory. Without it: 512 MiB on the CPU, half the GPU's free memory.

    :raises ValueError: a setting that is none of these, or a fraction on the CPU.
    """
    if setting is None:
        setting = DEFAULT_CUDA_KV_FRACTION if device.type == "cuda" else DEFAULT_CPU_KV_MEMORY
    amount: float | None = None
    if isinstance(setting, (int, float)) and not isinstance(setting, bool):
        amount = float(setting)
    elif isinstance(setting, str) and (match := MEMORY.fullmatch(setting)):
        amount = float(match[1]) * UNITS[(match[2] or "b").lower()]
        if match[2] is None and amount <= 1:  # "0.5": a fraction, as 0.5 is
            amount = float(match[1])
        elif amount <= 1:
            amount = None
    if amount is None or amount <= 0:
        raise ValueError(f"kvCacheMemory {setting!r} is not a size: give bytes (an integer, or "
                         "a number with a unit: 512MiB, 2GiB) or, on a GPU, a fraction of its "
                         "free memory (0.5).")
    if amount > 1:
        return int(amount)
    if device.type != "cuda":
        raise ValueError(f"kvCacheMemory {setting!r} is a fraction of a GPU's free memory, and "
                         "this worker runs on the CPU: give bytes, e.g. 512MiB.")
    free, _total = torch.cuda.mem_get_info(device)
    return int(free * amount)


def kv_budget(model: Any, setting: Any, device: torch.device) -> KVBudget:
    """The cache's size for ``model`` under model-config.yaml ``kvCacheMemory``.

    :raises ValueError: a bad setting, or one too small for a single block.
    """
    per_token = kv_bytes_per_token(model.config, model.dtype)
    budget = kv_memory(setting, device)
    page_size = CUDA_PAGE_SIZE if device.type == "cuda" else CPU_PAGE_SIZE
    blocks = budget // (per_token * page_size)
    if blocks < 1:
        raise ValueError(f"kvCacheMemory {setting!r} ({budget} bytes) does not hold one block of "
                         f"{page_size} tokens at {per_token} bytes a token: give at least "
                         f"{per_token * page_size} bytes.")
    return KVBudget(per_token, budget, page_size, blocks)


def key_share(model: Any) -> float:
    """What one key a prompt token attends to costs, as a share of what the token costs the
    rest of the model: attention does 2 × heads × head size multiply-adds a key in each layer
    (its score, then its value), the rest of the model one a weight (the embeddings aside).
    SmolLM2-135M: 3.3e-4, so 1,500 keys cost half a token (this box's SDPA takes ~1.7 times
    that: the clock's learned cost a unit takes up most of the difference)."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    head_size = getattr(config, "head_dim", None) or config.hidden_size // heads
    embeddings = {id(weight) for module in (model.get_input_embeddings(),
                                            model.get_output_embeddings())
                  if module is not None for weight in module.parameters()}
    weights = sum(weight.numel() for weight in model.parameters() if id(weight) not in embeddings)
    return 2 * config.num_hidden_layers * heads * head_size / max(weights, 1)


ATTENTION = "mservd_varlen_sdpa"  # (a name with "flash" in it would make transformers look
# for a flash-attn kernel)
READ_INDEX = "mservd_read_index"  # where a step's keys lie in the cache (read_keys_in_place)


def varlen_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, attention_mask: torch.Tensor | None,
                scaling: float | None = None, dropout: float = 0.0,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention for a step of the paged engine: each sequence's queries attend to its own
    keys only.

    transformers' SDPA path for continuous batching attends every query of the step to every
    key read for it, under a block-diagonal mask of (step tokens × all keys read): a 512-token
    prefill chunk beside 15 running sequences of 500 tokens costs 512 × 8,000 scores a head,
    and a step's time grew from 1.5 s to 4.6 s as the sequences grew (16 mixed prompts, this
    2-core box). Here a step costs about the sum of its sequences' own (queries × keys): a
    prompt (or a chunk of one: its queries are the last positions of its keys, causal from the
    bottom right) attends alone; decoding sequences (one query each) attend together, in
    groups of similar lengths padded to the longest of their group (:class:`DecodeGroup`), one
    call a group instead of one a sequence.

    With :func:`read_keys_in_place` (the engine's cache), ``key`` and ``value`` are the whole
    cache and ``kwargs[READ_INDEX]`` says where each sequence's keys lie in it: a prompt's
    keys are read out for it alone, and a group's straight into its padded rows, so no key is
    copied twice. Otherwise they are the step's keys read back in sequence order, and only
    decoding sequences of up to ``StepPlan.GROUP_KEYS`` keys are grouped. Outside the engine
    (no ``cu_seq_lens_q``) it is plain SDPA.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu_q = kwargs.get("cu_seq_lens_q")
    cu_k = kwargs.get("cu_seq_lens_k")
    if cu_q is None or cu_k is None or kwargs.get("block_table") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    heads, positions, dim = query.shape[1], query.shape[2], query.shape[3]
    out = query.new_zeros(1, heads, positions, dim)
    gqa = key.shape[1] != heads
    read = kwargs.get(READ_INDEX)
    plan = StepPlan.of(cu_q, cu_k, query.device, grouped_keys=None if read is not None
                       else StepPlan.GROUP_KEYS)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    kv_heads = key.shape[1]
    if read is not None:  # the cache, a row a slot and head: [slots × KV heads, dim]
        keys, values = (cache[0].transpose(0, 1).reshape(-1, dim) for cache in (key, value))
    for q0, q1, k0, k1 in plan.alone:
        q_len, k_len = q1 - q0, k1 - k0
        mask = None
        if 1 < q_len < k_len:  # a chunk after the sequence's cached tokens
            mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(
                k_len - q_len)
        if read is None:
            own_keys, own_values = key[:, :, k0:k1], value[:, :, k0:k1]
        else:
            own = cache_rows(read[k0:k1].unsqueeze(0), kv_heads)
            own_keys = keys.index_select(0, own).view(1, kv_heads, k_len, dim)
            own_values = values.index_select(0, own).view(1, kv_heads, k_len, dim)
        out[:, :, q0:q1] = sdpa(query[:, :, q0:q1], own_keys, own_values, attn_mask=mask,
                                is_causal=q_len == k_len and q_len > 1, scale=scaling,
                                enable_gqa=gqa)
    for group in plan.groups:
        rows, width = group.rows.numel(), group.width
        if read is None:
            group_keys = key[0].index_select(1, group.keys).view(-1, rows, width, dim)
            group_values = value[0].index_select(1, group.keys).view(-1, rows, width, dim)
            group_keys, group_values = group_keys.transpose(0, 1), group_values.transpose(0, 1)
        else:
            own = cache_rows(read.index_select(0, group.keys).view(rows, width), kv_heads)
            group_keys = keys.index_select(0, own).view(rows, kv_heads, width, dim)
            group_values = values.index_select(0, own).view(rows, kv_heads, width, dim)
        queries = query[0].index_select(1, group.rows).transpose(0, 1).unsqueeze(2)
        got = sdpa(queries, group_keys, group_values, attn_mask=group.mask, scale=scaling,
                   enable_gqa=gqa)
        out[0].index_copy_(1, group.rows, got.squeeze(2).transpose(0, 1))
    return out.transpose(1, 2).contiguous(), None


def cache_rows(slots: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The rows of a cache seen as [slots × KV heads, dim] that hold ``slots`` (sequences ×
    keys), each head's keys together: gathered, they are the (sequence, head, key, dim)
    layout SDPA reads quickest (a group of 16 × 600 keys attends in 2 ms a layer so, against
    4 ms from the cache's own slot-major order, this 2-core box)."""
    heads = torch.arange(kv_heads, device=slots.device).view(1, kv_heads, 1)
    return (slots.unsqueeze(1) * kv_heads + heads).flatten()


@dataclass(frozen=True)
class DecodeGroup:
    """Decoding sequences that attend in one call: each one's query position (``rows``), the
    positions of its keys padded to the group's longest (``keys``: rows × width, flat), and
    which of those are its own (``mask``, None when none is padding)."""

    rows: torch.Tensor
    keys: torch.Tensor
    width: int
    mask: torch.Tensor | None


@dataclass(frozen=True)
class StepPlan:
    """How a step's sequences attend: the bounds ``(q0, q1, k0, k1)`` of each that attends
    alone, and the groups of decoding ones. Every layer of a step has the same bounds, so the
    plan is made once a step (the last one is kept)."""

    alone: list[tuple[int, int, int, int]]
    groups: list[DecodeGroup]

    # A call costs about what copying 150 tokens' keys and values does (this 2-core box).
    # When the step's keys were read back in sequence order, a group gathers its keys a
    # second time while a sequence alone attends to them where they lie: so only sequences
    # of up to GROUP_KEYS keys are grouped then (16 mixed streams of 16-1,280 keys, all
    # grouped: 2.0-2.3 steps/s, against 2.3-2.8 one call each). Read from the cache in
    # place, every key is gathered once either way, and every decoding sequence is grouped...
    GROUP_KEYS = 256
    PADDING = 1.25  # ...and a group's keys, padded, are at most this many times its own...
    SLACK = 128  # ...plus this many
    last: ClassVar[tuple[Any, StepPlan] | None] = None

    @classmethod
    def of(cls, cu_q: torch.Tensor, cu_k: torch.Tensor, device: torch.device,
           grouped_keys: int | None = GROUP_KEYS) -> StepPlan:
        bounds = (tuple(cu_q.tolist()), tuple(cu_k.tolist()), device, grouped_keys)
        if cls.last is not None and cls.last[0] == bounds:
            return cls.last[1]
        plan = cls.make(*bounds)
        cls.last = (bounds, plan)
        return plan

    @classmethod
    def make(cls, bounds_q: tuple[int, ...], bounds_k: tuple[int, ...],
             device: torch.device, grouped_keys: int | None = GROUP_KEYS) -> StepPlan:
        """``grouped_keys``: the longest decoding sequence that is grouped (None: any)."""
        alone, decoding = [], []
        for i in range(len(bounds_q) - 1):
            q0, q1, k0, k1 = bounds_q[i], bounds_q[i + 1], bounds_k[i], bounds_k[i + 1]
            if q1 - q0 == 1 and 1 < k1 - k0 <= (grouped_keys or k1 - k0):
                decoding.append((k1 - k0, q0, k0))
            elif q1 > q0:
                alone.append((q0, q1, k0, k1))
        decoding.sort()
        members: list[list[tuple[int, int, int]]] = []
        own = 0
        for length, q0, k0 in decoding:
            size = len(members[-1]) + 1 if members else 0
            if not members or size * length > cls.PADDING * (own + length) + cls.SLACK:
                members.append([])
                own = 0
            members[-1].append((length, q0, k0))
            own += length
        groups = []
        for group in members:
            if len(group) == 1:  # alone: nothing to gather
                length, q0, k0 = group[0]
                alone.append((q0, q0 + 1, k0, k0 + length))
            else:
                groups.append(cls.group(group, device))
        return cls(alone, groups)

    @staticmethod
    def group(members: list[tuple[int, int, int]], device: torch.device) -> DecodeGroup:
        width = members[-1][0]  # sorted: the longest is last
        offsets = torch.arange(width)
        starts = torch.tensor([k0 for _, _, k0 in members]).unsqueeze(1)
        lengths = torch.tensor([length for length, _, _ in members]).unsqueeze(1)
        own = offsets < lengths
        keys = torch.where(own, starts + offsets, starts)  # padding reads the first key again
        mask = None if bool(own.all()) else own.view(len(members), 1, 1, width).to(device)
        return DecodeGroup(torch.tensor([q0 for _, q0, _ in members], device=device),
                           keys.flatten().to(device), width, mask)


def use_varlen_sdpa(model: Any, io: Any) -> None:
    """Make ``model`` attend with :func:`varlen_sdpa`, once transformers' batch processor is
    made (it accepts only its own implementations), and spare the processor the dense mask it
    would build and clear every step (``io``: its inputs and outputs)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, varlen_sdpa)
    model.set_attn_implementation(ATTENTION)
    io.attention_mask = None  # is_causal then; varlen_sdpa reads each sequence's bounds


def read_keys_in_place(cache: Any) -> bool:
    """Have the attention read each layer's keys and values where they lie in ``cache``
    (transformers' paged cache) instead of from a copy of them all.

    transformers writes a step's new keys and values into the cache and then reads back
    every key and value of every sequence in the step, in every layer (``index_select``:
    16 sequences of 600 tokens are 7 MB of keys and 7 of values a layer for SmolLM2), and
    the attention reads them from that copy; grouping decoding sequences then copied theirs
    once more. Here the cache's ``update`` writes the new ones as transformers does and hands
    the attention the whole cache with the read indices (``kwargs[READ_INDEX]``), and
    :func:`varlen_sdpa` gathers each sequence's keys once, straight into the layout it
    attends in. Only for a cache of one full-attention allocator read by index (a model
    with sliding-window layers keeps transformers' read-back); returns whether it applies.
    """
    allocators = list(cache.cache_allocators.values())
    if len(allocators) != 1 or allocators[0].layer_type != "full_attention":
        return False
    allocator = allocators[0]
    update = cache.update

    def update_in_place(key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
                        kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        read_index = kwargs["read_index"][allocator.index]
        if kwargs.get("block_table") is not None or read_index.numel() == 0:
            return update(key_states, value_states, layer_idx, kwargs)  # nothing cached to read
        kwargs["cu_seq_lens_k"] = kwargs["cu_seq_lens_k"][allocator.layer_type].to(torch.int32)
        kwargs["max_length_k"] = kwargs["max_length_k"][allocator.layer_type]
        write_index = kwargs["write_index"][allocator.index]
        k_cache, v_cache = allocator._kv_token_views[layer_idx]  # [slots, KV heads, dim]
        k_cache.index_copy_(0, write_index, key_states[0].transpose(0, 1))
        v_cache.index_copy_(0, write_index, value_states[0].transpose(0, 1))
        kwargs[READ_INDEX] = read_index
        return k_cache.transpose(0, 1).unsqueeze(0), v_cache.transpose(0, 1).unsqueeze(0)

    cache.update = update_in_place
    return True


class LeastRecentlyUsed:
    """Evicts the prefix cache's blocks least recently used first, and only as many as a step
    needs room for.

    A full block that no sequence holds any more stays cached for prefix reuse. transformers
    (5.25) keeps such blocks until the cache has no room for a step or its free share falls
    under the scheduler's safety margin, then evicts every one of them at once: a system
    prompt sent a moment ago goes with blocks nobody has asked for in minutes, and the next
    request prefills it again. Here a sequence whose next tokens do not fit, and the
    scheduler's margin check, evict the blocks freed longest ago until they fit (as vLLM's
    free-block queue does), and a sequence that ends releases its blocks last first, so that
    its tail goes before its head (a block is found only through the blocks before it: a head
    without its tail is still reused, a tail without its head never is). A block reused and
    released again is the most recent once more. transformers' own evict-all is left only on
    its path to preempting a running sequence, when no cached block is left to evict anyway.
    """

    def __init__(self, cache: Any, scheduler: Any) -> None:
        self.cache = cache
        self.scheduler = scheduler
        for allocator in cache.cache_allocators.values():
            allocator.free_blocks = self._releaser(allocator)
        scheduler._try_to_meet_safety_margin = self.meet_margin
        store = cache.can_store_request_tokens

        def can_store_request_tokens(state: Any, request_len: int, dry_run: bool = False) -> bool:
            """transformers' check that a sequence's next tokens fit (allocating their blocks
            when they do), evicting the least recently used cached blocks while they do not."""
            while not store(state, request_len, dry_run):
                if dry_run or not self.evict_oldest():
                    return False
                cache.pool.try_to_free_sectors()
            return True
        cache.can_store_request_tokens = can_store_request_tokens

    @staticmethod
    def _releaser(allocator: Any) -> Callable[..., None]:
        def free_blocks(request_id: str, no_cache: bool = False) -> None:
            """transformers' ``free_blocks``, releasing the last block first."""
            blocks = allocator.block_table.pop(request_id, [])
            freed = [block for block in reversed(blocks)
                     if allocator.ledger.release(block, no_cache)]
            allocator.pool.free_blocks(allocator.index, freed)
        return free_blocks

    def meet_margin(self) -> bool:
        """The scheduler's check before it admits prompts: whether the free share of the cache
        is at least its margin, after evicting the fewest cached blocks that make it so."""
        cache, margin = self.cache, self.scheduler.safety_margin
        cache.pool.try_to_free_sectors()
        while cache.compute_free_capacity() < margin and self.evict_oldest():
            pass
        cache.pool.try_to_free_sectors()
        return cache.compute_free_capacity() >= margin

    def evict_oldest(self) -> bool:
        """Evict the least recently released cached block of each kind of attention (one
        kind for most models); whether there was any."""
        evicted = False
        for allocator in self.cache.cache_allocators.values():
            ledger = allocator.ledger
            if not ledger.cached_blocks:
                continue
            block = next(iter(ledger.cached_blocks))  # in the order they were released
            del ledger.cached_blocks[block]
            del ledger.hash_to_block[ledger.block_to_hash.pop(block)]
            self.cache.pool.free_blocks(allocator.index, [block])
            evicted = True
        return evicted


class StepClock:
    """What a step costs, learned from the steps the engine runs: a step of decoding alone
    (the median of the last :attr:`DECODING_STEPS`), and a unit of prompt work beside
    decoding ones, where a prompt token is one unit and each key it attends to ``key_share``
    of one (running averages, the newest step weighing :attr:`WEIGHT`).

    A fixed share of prompt tokens a step cannot suit both ends of the traffic: beside four
    short streams (a step of ~170 ms on this 2-core box) 64 prompt tokens already double
    their gap, beside fifteen long ones (~450 ms) they stretch it by a third while the prompt
    waits eight steps for its first token. :meth:`prompt_tokens` sizes the share by time
    instead: the prompt tokens that make a decoding step take ``stretch`` times as long
    (Sarathi-Serve's budget, learned rather than profiled). The keys count because a long
    prompt's last chunks attend to all its earlier tokens: on this box 64 tokens 1,500 into a
    prompt add ~1.8 times what they add at its start, and one cost a token, learned from the
    chunks before, is low for each next one. What a key costs beside a token is the model's
    arithmetic (:func:`key_share`), not learned: fitted from the steps as well (tried on a
    simulation with this box's costs and noise), it drifted with the noise, and where it came
    out near nothing the next prompt's first chunk ran to 5-11 times the decoding step. A
    chunk grows at most twofold a step, so that one step that ran quick by chance does not
    buy the next one a prompt's worth. The decoding step is a median because no step decodes
    alone while a prompt is prefilled, so the last ones before it set every chunk's size: with
    a running average of them, a whole prompt's chunk steps ran at 2.5-3.1 times the streams'
    median gap in one run and at 1.6-1.8 in another (through the daemon, four streams and a
    1,500-token prompt), as one slow or quick step among the last few had it.
    """

    WEIGHT = 0.25
    DECODING_STEPS = 7
    MIN_PROMPT_TOKENS = 16  # a step of prompts alone with fewer says little about a token
    MIN_CHUNK = 16  # what a chunk grows twofold from when the last was smaller (or none yet)

    def __init__(self, stretch: float, key_share: float = 0.0) -> None:
        self.stretch = stretch
        self.key_share = key_share
        self.decoding: float | None = None  # seconds: a step of decoding sequences alone...
        self.decoding_steps: deque[float] = deque(maxlen=self.DECODING_STEPS)  # ...the median
        self.prefill_unit: float | None = None  # seconds a unit of prompts run alone: a guess
        self.added: float | None = None  # seconds a chunk added to a decoding step...
        self.units: float | None = None  # ...for this much work (running means both)
        self.last_chunk = 0  # the prompt tokens of the last step beside decoding ones

    def record(self, seconds: float, decoding: int, prompt_tokens: int, keys: int = 0) -> None:
        """Learn from a step that took ``seconds`` to run ``decoding`` decoding sequences and
        ``prompt_tokens`` tokens of prompts, which attended to ``keys`` keys in all."""
        units = prompt_tokens + self.key_share * keys
        if decoding and not prompt_tokens:
            self.decoding_steps.append(seconds)
            self.decoding = statistics.median(self.decoding_steps)
        elif not decoding:
            if prompt_tokens >= self.MIN_PROMPT_TOKENS:
                self.prefill_unit = self._average(self.prefill_unit, seconds / units)
        elif self.decoding is not None:
            self.added = self._average(self.added, max(seconds - self.decoding, 0.0))
            self.units = self._average(self.units, units)
            self.last_chunk = prompt_tokens

    def unit_cost(self) -> float | None:
        """Seconds a unit of prompt work adds to a step beside decoding sequences (until one
        has run beside them, what it took alone); None until a prompt has been timed."""
        if self.added and self.units:
            return self.added / self.units
        return self.prefill_unit

    def prompt_tokens(self, past: int = 0) -> int:
        """The prompt tokens a step beside decoding sequences may run to take ``stretch``
        times a decoding step, when they go on with a prompt ``past`` tokens in; 0 until
        both costs are known."""
        cost = self.unit_cost()
        if not self.decoding or not cost:
            return 0
        units = (self.stretch - 1) * self.decoding / cost
        # n tokens after ``past`` attend to n × past + n (n + 1) / 2 keys
        linear = 1 + self.key_share * (past + 0.5)
        if self.key_share:
            share = self.key_share
            tokens = (math.sqrt(linear * linear + 2 * share * units) - linear) / share
        else:
            tokens = units / linear
        return max(0, min(int(tokens), 2 * max(self.last_chunk, self.MIN_CHUNK)))

    def _average(self, mean: float | None, sample: float) -> float:
        return sample if mean is None else mean + self.WEIGHT * (sample - mean)


class PagedEngine:
    """transformers' continuous-batching engine for one model, stepped by the caller.

    :param pick: the next token of request ``rid`` from its logits (one row, float32); called
        for every sequence that gets a token in a step, in the step's order. It must not raise:
        an error there fails the whole step.
    :param streaming_batch_tokens: the prompt tokens a step beside decoding sequences runs
        for each prompt in line (default a quarter of ``max_batch_tokens``)...
    :param step_stretch: ...or, when it is more, what makes the step take this many times a
        step of the decoding sequences alone (:class:`StepClock`; default 1: never more).
    """

    def __init__(self, model: Any, budget: KVBudget, max_batch_tokens: int,
                 pick: Callable[[str, torch.Tensor], int], prefix_caching: bool = True,
                 streaming_batch_tokens: int | None = None,
                 step_stretch: float | None = None) -> None:
        from transformers import ContinuousBatchingConfig, GenerationConfig
        from transformers.generation.continuous_batching.requests import RequestStatus

        self.model = model
        self.budget = budget
        self.pick = pick
        self.DECODING = RequestStatus.DECODING
        # each request says its max_new_tokens and its EOS (none: -1)
        generation = GenerationConfig(do_sample=False, max_new_tokens=1, eos_token_id=-1)
        config = ContinuousBatchingConfig(
            page_size=budget.page_size,
            num_blocks=budget.num_blocks,  # never sized by transformers (60% of RAM on a CPU)
            max_batch_tokens=max_batch_tokens,
            max_memory_percent=1.0,  # only checked: the cache and its buffers must fit at all
            allow_block_sharing=prefix_caching,  # off: every prompt is computed in full
            scheduler_type="fifo",  # decoding first, then prefill chunks with what is left
            use_cuda_graph=False,  # our sampler is Python: it cannot be captured in a graph
            max_blocks_per_request=0,  # no block-table decoding: that path needs flash-attn
            use_async_batching=False,
            auto_switch_to_flash=False,  # sdpa, as loaded: flash_attn may be missing offline
        )
        if model.device.type == "cuda":
            torch.cuda.set_device(model.device)  # the engine sizes and streams on this GPU
        if model.config._attn_implementation == ATTENTION:  # a second engine on one model
            model.set_attn_implementation("sdpa")
        self.manager = model.init_continuous_batching(generation_config=generation,
                                                      continuous_batching_config=config)
        # what the manager's start() does on its thread, without the thread
        self.manager.background_thread_status.clear()
        self.processor = self.manager._create_batch_processor()
        use_varlen_sdpa(model, self.processor.inputs_and_outputs)
        read_keys_in_place(self.processor.cache)
        self.manager.batch_processor = self.processor
        self.manager.current_batch = 0
        self.processor.model_runner._sample = self._sample
        self.cache = self.processor.cache
        if prefix_caching:
            LeastRecentlyUsed(self.cache, self.processor.scheduler)
        # a step's token budget: all of it when no sequence decodes, a share beside decoding
        # ones, so that a long prompt's chunks do not stretch every stream's next token
        self.batch_tokens = max_batch_tokens
        self.streaming_batch_tokens = min(max_batch_tokens, streaming_batch_tokens
                                          or max(32, max_batch_tokens // 4))
        self.clock = StepClock(step_stretch or 1.0, key_share(model))
        self.capacity = self.cache.num_blocks * budget.page_size  # tokens
        self.reused = 0  # prompt tokens found in the cache since the last usage()
        search = self.cache.search_prefix_match

        def counted_search(request_id: str, prompt_ids: list[int]) -> int:
            found = search(request_id, prompt_ids)
            self.reused += found
            return found
        self.cache.search_prefix_match = counted_search  # the scheduler's one way to reuse
        self.requests: dict[str, int] = {}  # request id -> the tokens it may take (prompt + new)
        self.seen: dict[str, int] = {}  # request id -> the tokens it was given so far
        logger.info("KV cache: %d bytes a token (%s), %d bytes budget, %d blocks of %d tokens: "
                    "%d tokens fit; %d tokens a step", budget.bytes_per_token, model.dtype,
                    budget.budget, self.cache.num_blocks, budget.page_size, self.capacity,
                    self.processor.max_batch_tokens)

    def add(self, rid: str, prompt: list[int], max_new_tokens: int, eos: list[int]) -> None:
        """Queue a sequence; it runs when the scheduler has room for it (the caller has checked
        that ``prompt`` and ``max_new_tokens`` fit :attr:`capacity`). ``eos`` ends it (none:
        it runs to ``max_new_tokens``)."""
        self.requests[rid] = len(prompt) + max_new_tokens
        self.seen[rid] = 0
        self.manager.add_request(prompt, request_id=rid, max_new_tokens=max_new_tokens,
                                 streaming=True, eos_token_id=eos or [])

    def cancel(self, rid: str) -> None:
        """End a sequence: its blocks are freed at the next step (a full block stays cached
        for prefix reuse until its room is wanted)."""
        if self.requests.pop(rid, None) is not None:
            self.seen.pop(rid, None)
            self.manager.cancel_request(rid)

    def step(self) -> EngineStep:
        """One forward pass for every sequence the scheduler runs now.

        A step the cache has no room for (transformers: "No requests can be scheduled…")
        ends the largest sequence alone, which goes into ``failed``; any other failure cancels
        every sequence and raises.
        """
        result = EngineStep()
        processor = self.processor
        scheduler = processor.scheduler
        decoding = {rid for rid, state in scheduler.active_requests.items()
                    if state.status == self.DECODING}
        prompts = (len(scheduler.active_requests) - len(decoding) + len(scheduler.waiting_requests)
                   + processor.input_queue.qsize())  # (added since the last step: not moved yet)
        processor.max_batch_tokens = self.step_tokens(len(decoding), prompts, self.prompt_past())
        scheduler.safety_margin = self.margin(len(scheduler.active_requests))
        try:
            with torch.inference_mode():
                started = time.perf_counter()
                if processor.prepare_next_batch():
                    batch = processor.inputs_and_outputs.requests_in_batch
                    result.scheduled = {future.state.request_id: future.query_length
                                        for future in batch}
                    # (each prompt token attends to the keys up to its own: its position + 1;
                    # the batch has moved each sequence's position past this step's tokens)
                    keys = sum(future.query_length * (2 * future.state.position_offset
                                                      - future.query_length + 1) // 2
                               for future in batch if future.state.request_id not in decoding)
                    processor._generation_step(self.model)
                    processor.update_batch()  # (reads the tokens back: a GPU's step is done)
                    self.clock.record(time.perf_counter() - started, len(decoding),
                                      sum(result.scheduled.values()) - len(decoding), keys)
        except RuntimeError as exc:
            if not str(exc).startswith(NO_ROOM) or not self.requests:
                self.cancel_all()
                raise
            rid = max(self.requests, key=self.requests.__getitem__)
            result.failed[rid] = (f"The KV cache has no room for this request's "
                                  f"{self.requests[rid]} tokens (prompt and max_tokens) beside "
                                  f"the others; the cache holds {self.capacity} tokens.")
            logger.error("request %s stopped: %s", rid, result.failed[rid])
            self.cancel(rid)
        except Exception:
            self.cancel_all()
            raise
        for output in self.outputs():
            rid = output.request_id
            if rid not in self.requests:  # cancelled since
                continue
            if output.error is not None:
                result.failed[rid] = str(output.error)
                self.cancel(rid)
                continue
            tokens = list(output.generated_tokens)
            result.tokens[rid] = tokens[self.seen[rid]:]
            self.seen[rid] = len(tokens)
            if output.is_finished():
                result.finished.add(rid)
                self.requests.pop(rid, None)
                self.seen.pop(rid, None)
        return result

    def step_tokens(self, decoding: int, prompts: int, past: int = 0) -> int:
        """The tokens a step may run: all of the budget when no sequence decodes; beside
        decoding ones, their tokens and ``streaming_batch_tokens`` of prompt for each prompt
        waiting or being prefilled, or what the clock says stretches their step by its factor
        when the prompt goes on ``past`` tokens in, if that is more; up to the budget. One
        long prompt joining a few streams stretches their next tokens little; a queue of
        prompts gets a share that grows with it, so that it drains sooner. Every decoding
        sequence gets its token, whatever the budget."""
        if not decoding:
            return self.batch_tokens
        prompt = max(self.streaming_batch_tokens * max(1, prompts),
                     self.clock.prompt_tokens(past))
        return max(decoding, min(self.batch_tokens, decoding + prompt))

    def prompt_past(self) -> int:
        """Where the next step's prompt tokens begin: how far the prompt being prefilled has
        got (the scheduler goes on with it first), or 0 for a new one."""
        for state in self.processor.scheduler.active_requests.values():
            if state.status != self.DECODING:
                return int(state.position_offset)
        return 0

    def margin(self, active: int) -> float:
        """The share of the cache that must stay free for a prompt to be prefilled beside
        decoding sequences: a block for each sequence in the cache, so that every one of them
        can grow by a block before anyone is preempted.

        transformers keeps 15 % free, and a prompt, even one half prefilled, waits while less
        is: 16 mixed sequences of ~650 tokens fill the sample's 11,648-token cache to 87-90 %,
        and each new prompt waited there for others to finish (first token 7-8 s at the
        median, 15-16 s at p90, in process). One block each is what vLLM's scheduler keeps
        in spirit: it admits while blocks are free and preempts when a running sequence
        cannot grow.
        """
        return min(1.0, active / self.cache.num_blocks)

    def outputs(self) -> list[Any]:
        """The step's outputs (each sequence's tokens so far), in order."""
        out = []
        delivered = self.manager.output_router.output_queue
        while True:
            try:
                out.append(delivered.get_nowait())
            except queue.Empty:
                return out

    def cancel_all(self) -> None:
        for rid in list(self.requests):
            self.cancel(rid)
        self.outputs()

    def blocks_held(self, rid: str) -> int:
        """The cache blocks ``rid`` holds now (shared ones included)."""
        return sum(len(allocator.block_table.get(rid, ()))
                   for allocator in self.cache.cache_allocators.values())

    def usage(self) -> CacheUsage:
        """The cache's size and use in tokens; the reused prompt tokens since the last call.
        A full block no sequence holds any more is free: it stays cached for prefix reuse
        only until its room is wanted."""
        # (a cancelled sequence's blocks are freed at the next step: they count no more)
        held = max((len({block for rid, blocks in allocator.block_table.items()
                         if rid in self.requests for block in blocks})
                    for allocator in self.cache.cache_allocators.values()), default=0)
        reused, self.reused = self.reused, 0
        return CacheUsage(self.capacity, held * self.budget.page_size, reused)

    def waiting(self) -> list[str]:
        """The sequences queued for room, in order."""
        return list(self.processor.scheduler.waiting_requests)

    def _sample(self, scores: torch.Tensor, output_ids: torch.Tensor) -> None:
        """Replaces transformers' sampler (``ModelRunner._sample``): row ``i`` of ``scores``
        is the ``i``-th sequence of the step that gets a token, in batch order."""
        rows = [future.state.request_id
                for future in self.processor.inputs_and_outputs.requests_in_batch
                if future.has_new_token]
        for i, rid in enumerate(rows):
            output_ids[0, i] = self.pick(rid, scores[0, i])
