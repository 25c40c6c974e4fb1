"""The causal LM's engine (``handlers/paged_engine.py``): transformers' continuous batching
stepped one call at a time, on the real SmolLM2 sample. It drives semi-private transformers
code (pinned in pyproject.toml): a transformers upgrade that breaks the stepper fails here."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_causal_lm_step import model_dir  # noqa: F401 (the sample's folder, a fixture)

from handlers import paged_engine
from handlers.paged_engine import KVBudget, PagedEngine

CPU = torch.device("cpu")
PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M: 30 layers, 3 KV heads of 64, float32


@pytest.fixture(scope="module")
def model(model_dir) -> Any:  # noqa: F811
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                attn_implementation="sdpa").eval()


def greedy(rid: str, logits: torch.Tensor) -> int:
    return int(torch.argmax(logits))


def engine(model: Any, blocks: int = 64, step_tokens: int = 256, pick=greedy) -> PagedEngine:
    return PagedEngine(model, KVBudget(PER_TOKEN, blocks * 32 * PER_TOKEN, 32, blocks),
                       step_tokens, pick)


def drive(eng: PagedEngine, steps: int = 400, trace: list | None = None) -> dict[str, list[int]]:
    """Steps until the engine has nothing left: each request's tokens (or its failure)."""
    got: dict[str, Any] = {}
    for _ in range(steps):
        if not eng.requests:
            return got
        ran = eng.step()
        for rid, tokens in ran.tokens.items():
            got.setdefault(rid, []).extend(tokens)
        got.update(ran.failed)
        if trace is not None:
            trace.append((set(eng.processor.scheduler.active_requests), set(eng.waiting()),
                          dict(ran.scheduled)))
    raise AssertionError("the engine did not finish in time")


def alone(model: Any, prompt: list[int], count: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=count, min_new_tokens=count,
                         do_sample=False)
    return out[0, len(prompt):].tolist()


def prompt(i: int, length: int = 50) -> list[int]:
    """A prompt of ``length`` tokens, different for each ``i``."""
    return [100 + (i * 7 + j * 13) % 5000 for j in range(length)]


def test_bytes_per_token_count_the_grouped_kv_heads(model) -> None:
    assert paged_engine.kv_bytes_per_token(model.config, torch.float32) == PER_TOKEN
    assert paged_engine.kv_bytes_per_token(model.config, torch.bfloat16) == PER_TOKEN // 2
    budget = paged_engine.kv_budget(model, "512MiB", CPU)
    assert (budget.page_size, budget.num_blocks) == (32, 2**29 // (PER_TOKEN * 32))
    assert paged_engine.kv_budget(model, None, CPU) == budget  # the CPU's default


@pytest.mark.parametrize(("setting", "expected"), [
    (1_000_000, 1_000_000), ("512MiB", 512 * 2**20), ("2GiB", 2 * 2**30), ("1.5GB", 1.5e9),
    (" 64 kib ", 65536), ("300000000", 300_000_000),
])
def test_kv_cache_memory_is_bytes_with_or_without_a_unit(setting, expected) -> None:
    assert paged_engine.kv_memory(setting, CPU) == expected


@pytest.mark.parametrize(("setting", "words"), [
    ("lots", "is not a size"), (-5, "is not a size"), (True, "is not a size"),
    ("0MiB", "is not a size"), (0.5, "runs on the CPU: give bytes"),
    ("0.25", "runs on the CPU: give bytes"),
])
def test_kv_cache_memory_refuses_what_is_not_a_size_for_this_device(setting, words) -> None:
    with pytest.raises(ValueError, match=words):
        paged_engine.kv_memory(setting, CPU)


def test_a_budget_below_one_block_is_refused(model) -> None:
    with pytest.raises(ValueError, match="does not hold one block of 32 tokens"):
        paged_engine.kv_budget(model, "1MiB", CPU)


def test_the_stepper_gives_what_generate_gives_one_token_a_step(model) -> None:
    eng = engine(model)
    assert eng.cache.num_blocks == 64 and eng.capacity == 64 * 32
    prompts = {f"r{i}": prompt(i, 20 + 10 * i) for i in range(3)}
    for rid, ids in prompts.items():
        eng.add(rid, ids, 12, eos=[])
    trace: list = []
    got = drive(eng, trace=trace)
    for rid, ids in prompts.items():
        assert got[rid] == alone(model, ids, 12)
    assert all(len(t[2]) == 3 for t in trace[:12])  # all three in every step
    assert torch.is_inference_mode_enabled() is False


def test_a_second_prompt_with_the_same_prefix_reuses_its_blocks(model) -> None:
    eng = engine(model, step_tokens=512)
    shared = prompt(0, 320)  # ten blocks of 32
    eng.add("first", shared + [7, 8, 9], 2, eos=[])
    first: list = []
    drive(eng, trace=first)
    assert eng.usage().reused_tokens == 0
    assert eng.usage().used_tokens == 0  # its blocks stay cached, but nobody holds them
    eng.add("second", shared + [10, 11, 12], 2, eos=[])
    step = eng.step()
    assert eng.usage() == paged_engine.CacheUsage(64 * 32, 11 * 32, 320)  # ten shared, one own
    second: list = []
    got = drive(eng, trace=second)
    ran = [step.scheduled.get("second", 0)] + [s.get("second", 0) for _, _, s in second]
    got["second"] = step.tokens.get("second", []) + got.get("second", [])
    assert sum(ran) <= 3 + 32 + 1 and ran[0] < 40  # its 320 shared tokens were not run again
    assert sum(scheduled.get("first", 0) for _, _, scheduled in first) >= 323
    assert got["second"] == alone(model, shared + [10, 11, 12], 2)


def test_the_prefix_cache_evicts_the_least_recently_used_blocks_tail_first(model) -> None:
    """Seven prompts of three full blocks each, one after another, in a cache of 20 blocks:
    the blocks freed longest ago go first, only as many as a prompt needs room for (and the
    one block the running sequence keeps free), a prompt's last block before its first, and a
    prompt used again is kept."""
    eng = engine(model, blocks=20, step_tokens=256)

    def run(rid: str, i: int, length: int = 97) -> tuple[int, list[int]]:
        eng.add(rid, prompt(i, length), 2, eos=[])
        reused, got = 0, []
        while eng.requests:
            got += eng.step().tokens.get(rid, [])
            reused += eng.usage().reused_tokens
        return reused, got

    for rid, i in [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("a again", 1), ("e", 5), ("f", 6),
                   ("g", 7)]:
        run(rid, i)
    ledger = next(iter(eng.cache.cache_allocators.values())).ledger
    assert len(ledger.cached_blocks) == 18  # of 21 full blocks: b's three, the oldest, went
    run("h, one block and a half", 8, 40)  # room for its two blocks and a free one: c's last
    reused, got = run("a, used again before the others", 1)
    assert reused == 96 and got == alone(model, prompt(1, 97), 2)
    assert run("c, its first two blocks left", 3)[0] == 64
    assert run("b, the least recently used", 2)[0] == 0


def test_a_long_prompt_is_prefilled_over_steps_while_the_streams_go_on(model) -> None:
    eng = engine(model, step_tokens=64)
    for i in range(3):
        eng.add(f"s{i}", prompt(i, 10), 30, eos=[])
    eng.step()  # the three short prompts
    long = prompt(9, 400)
    eng.add("long", long, 3, eos=[])
    steps: list[paged_engine.EngineStep] = []
    while not steps or "long" not in steps[-1].tokens:
        steps.append(eng.step())
        assert len(steps) <= 20, "the long prompt got no token in 20 steps"
    assert len(steps) >= 400 // 64  # prefilled over several steps...
    for ran in steps:  # ...and every stream got a token in each of them
        assert all(len(ran.tokens.get(f"s{i}", [])) == 1 for i in range(3))
        assert sum(ran.scheduled.values()) <= 64
    got = drive(eng)
    assert steps[-1].tokens["long"] + got["long"] == alone(model, long, 3)


def test_beside_decoding_streams_a_queue_of_prompts_gets_a_share_of_the_step_each(model) -> None:
    """One prompt joining two streams gets ``streaming_batch_tokens`` of a step; four queued
    prompts get that each (the first prompt in line takes it all, FIFO), up to the budget."""
    eng = PagedEngine(model, KVBudget(PER_TOKEN, 64 * 32 * PER_TOKEN, 32, 64), 512, greedy,
                      streaming_batch_tokens=32)
    for i in range(2):
        eng.add(f"s{i}", prompt(i, 10), 40, eos=[])
    eng.step()  # both prompts in one step: nothing decodes yet
    eng.add("p0", prompt(10, 200), 2, eos=[])
    assert eng.step().scheduled == {"s0": 1, "s1": 1, "p0": 32}
    for i in range(1, 4):
        eng.add(f"p{i}", prompt(10 + i, 200), 2, eos=[])
    assert eng.step().scheduled == {"s0": 1, "s1": 1, "p0": 4 * 32}
    assert eng.step_tokens(decoding=2, prompts=40) == 512  # never over the budget


def test_the_step_clock_gives_prompts_what_stretches_a_decoding_step_by_its_factor() -> None:
    clock = paged_engine.StepClock(stretch=2.0)
    assert clock.prompt_tokens() == 0  # nothing timed yet: the per-prompt share alone
    clock.record(0.5, decoding=0, prompt_tokens=250)  # a prompt alone: 2 ms a token
    clock.record(0.2, decoding=4, prompt_tokens=0)  # four streams alone: 200 ms
    assert clock.prompt_tokens() == 32  # 100 would double it, but a chunk grows twofold a step
    clock.record(0.264, decoding=4, prompt_tokens=32)  # beside them: (264 - 200) / 32 = 2 ms
    assert clock.prompt_tokens() == 64
    clock.record(0.328, decoding=4, prompt_tokens=64)
    assert clock.prompt_tokens() == 100  # 200 ms more: twice the decoding step
    for _ in range(40):  # fifteen long streams: 450 ms; a prompt token costs 2.5 ms now
        clock.record(0.45, decoding=15, prompt_tokens=0)
        clock.record(0.45 + 0.25, decoding=15, prompt_tokens=100)
    assert clock.prompt_tokens() == pytest.approx(180, abs=2)
    clock.record(0.9, decoding=15, prompt_tokens=0)  # one slow step (a prompt coming in)...
    assert clock.prompt_tokens() == pytest.approx(180, abs=2)  # ...moves the median nothing
    assert paged_engine.StepClock(stretch=1.0).prompt_tokens() == 0


def test_a_chunk_deep_in_a_prompt_gets_fewer_tokens_for_the_keys_they_attend_to() -> None:
    """n tokens ``past`` tokens into a prompt attend to n × past + n (n + 1) / 2 keys: 1,500
    in, each of them costs 2.5 times what it costs at the start with a key share of 1/1,000."""
    clock = paged_engine.StepClock(stretch=2.0, key_share=1e-3)

    def chunk(tokens: int, past: int) -> tuple[float, int]:  # beside 200 ms of decoding
        keys = tokens * past + tokens * (tokens + 1) // 2
        return 0.2 + 0.002 * (tokens + 1e-3 * keys), keys  # 2 ms a unit of work

    clock.record(0.2, decoding=4, prompt_tokens=0)
    for tokens, past in ((32, 0), (64, 32), (96, 96), (64, 700), (64, 1500)):
        seconds, keys = chunk(tokens, past)
        clock.record(seconds, decoding=4, prompt_tokens=tokens, keys=keys)
    assert clock.unit_cost() == pytest.approx(0.002)
    for past in (0, 1500):  # the most tokens that keep the step within twice the decoding one
        tokens = clock.prompt_tokens(past)
        assert chunk(tokens, past)[0] <= 0.4 < chunk(tokens + 1, past)[0]
    assert (clock.prompt_tokens(0), clock.prompt_tokens(1500)) == (95, 39)


def test_the_engine_times_each_chunk_with_the_keys_its_tokens_attend_to(model) -> None:
    eng = PagedEngine(model, KVBudget(PER_TOKEN, 64 * 32 * PER_TOKEN, 32, 64), 512, greedy,
                      streaming_batch_tokens=32, step_stretch=2.0)
    timed: list[tuple[int, int, int]] = []
    record = eng.clock.record

    def told(seconds: float, decoding: int, prompt_tokens: int, keys: int = 0) -> None:
        timed.append((decoding, prompt_tokens, keys))
        record(seconds, decoding, prompt_tokens, keys)

    eng.clock.record = told  # type: ignore[method-assign]
    for i in range(2):
        eng.add(f"s{i}", prompt(i, 10), 40, eos=[])
    eng.step()  # both prompts alone: each token attends to itself and the ones before it
    assert timed[-1] == (0, 20, 2 * (10 * 11 // 2))
    eng.add("long", prompt(9, 200), 2, eos=[])
    chunks: list[int] = []
    answered = False
    while not answered:
        assert eng.prompt_past() == sum(chunks)  # where the next chunk goes on
        answered = "long" in eng.step().tokens
        decoding, tokens, keys = timed[-1]
        past = sum(chunks)
        assert decoding == 2 and keys == tokens * past + tokens * (tokens + 1) // 2
        chunks.append(tokens)
    assert chunks == [32] * 6 + [8]  # no decoding step timed alone yet: the share a prompt


def test_beside_decoding_streams_a_prompt_gets_the_clocks_share_when_it_is_more(model) -> None:
    eng = PagedEngine(model, KVBudget(PER_TOKEN, 64 * 32 * PER_TOKEN, 32, 64), 512, greedy,
                      streaming_batch_tokens=64, step_stretch=2.0)
    eng.clock.key_share = 0.0  # (keys free: a token's cost alone decides)
    eng.clock.decoding = 0.45  # as learned: 2.5 ms a prompt token beside them, 180 tokens
    eng.clock.added, eng.clock.units, eng.clock.last_chunk = 0.25, 100, 100
    assert eng.step_tokens(decoding=15, prompts=1) == 15 + 180
    assert eng.step_tokens(decoding=15, prompts=4) == 15 + 4 * 64  # the queue's share is more
    assert eng.step_tokens(decoding=0, prompts=1) == 512  # nothing decodes: all of it
    eng.clock.decoding = 2.0
    assert eng.step_tokens(decoding=15, prompts=1) == 15 + 200  # twice the last chunk at most
    eng.clock.last_chunk = 400
    assert eng.step_tokens(decoding=15, prompts=1) == 512  # never over the budget


def test_a_prompt_is_prefilled_beside_streams_while_a_block_is_free_for_each(model) -> None:
    """Two streams hold 56 of 64 blocks (12.5 % free, under transformers' 15 % margin): a
    new prompt of four blocks is still prefilled beside them, and answers as generate()."""
    eng = engine(model, blocks=64, step_tokens=512)
    for i in range(2):
        eng.add(f"s{i}", prompt(i, 890), 40, eos=[])
    while len(eng.requests) == 2 and sum(map(eng.blocks_held, eng.requests)) < 56:
        eng.step()
    assert eng.cache.compute_free_capacity() < 0.15
    eng.add("new", prompt(5, 100), 3, eos=[])
    steps = [eng.step() for _ in range(3)]
    assert steps[0].scheduled == {"s0": 1, "s1": 1, "new": 100}
    assert steps[0].tokens["new"] + steps[1].tokens["new"] + steps[2].tokens["new"] == alone(
        model, prompt(5, 100), 3)


def test_a_request_waits_for_room_and_preempted_ones_are_recomputed_exactly(model) -> None:
    """Eight blocks of 32 tokens, four requests of 110: some wait, some are preempted (their
    blocks freed, recomputed later from prompt and tokens so far); all end as generate()."""
    eng = engine(model, blocks=8, step_tokens=128)
    prompts = {f"r{i}": prompt(i, 50) for i in range(4)}
    for rid, ids in prompts.items():
        eng.add(rid, ids, 60, eos=[])
    trace: list = []
    got = drive(eng, trace=trace)
    assert any(waiting for _, waiting, _ in trace[1:])  # one waited for room
    ran_before: set[str] = set()
    preempted = set()
    for active, waiting, _ in trace:
        preempted |= ran_before & waiting
        ran_before |= active
    assert preempted, "no request was preempted"
    for rid, ids in prompts.items():
        assert got[rid] == alone(model, ids, 60), rid


def test_the_cache_holds_each_sequences_own_tokens_and_under_one_block_more(model) -> None:
    """Mixed lengths: after every step the blocks held are the sequences' own tokens rounded
    up to a block each, never the longest one's length times their number."""
    eng = engine(model, step_tokens=512)
    lengths = {"a": 12, "b": 300, "c": 70, "d": 33}
    for rid, length in lengths.items():
        eng.add(rid, prompt(len(rid) + length, length), 6, eos=[])
    own = dict.fromkeys(lengths, 0)
    for _ in range(20):
        if not eng.requests:
            break
        ran = eng.step()
        for rid, count in ran.scheduled.items():
            own[rid] += count
        running = [rid for rid in eng.requests if eng.blocks_held(rid)]
        held = eng.usage().used_tokens
        tokens = sum(own[rid] for rid in running)
        assert tokens <= held <= tokens + 31 * len(running), (held, tokens, running)
    assert not eng.requests


def test_a_step_without_room_fails_the_largest_request_alone(model) -> None:
    eng = engine(model, blocks=4)
    eng.add("small", prompt(1, 20), 5, eos=[])
    eng.add("huge", prompt(2, 400), 10, eos=[])  # 410 tokens: the cache holds 128
    got = drive(eng)
    assert "no room" in got["huge"] and "410 tokens" in got["huge"]
    assert got["small"] == alone(model, prompt(1, 20), 5)
    assert not eng.requests
    eng.step()  # (a cancelled sequence's blocks are freed at the next step)
    assert eng.blocks_held("huge") == 0


def test_a_cancelled_sequence_frees_its_blocks(model) -> None:
    eng = engine(model)
    eng.add("going", prompt(1, 100), 50, eos=[])
    eng.add("staying", prompt(2, 30), 8, eos=[])
    for _ in range(3):
        eng.step()
    assert eng.blocks_held("going") == 4  # 103 tokens in blocks of 32
    eng.cancel("going")
    ran = eng.step()
    assert "going" not in ran.tokens and eng.blocks_held("going") == 0
    assert "going" not in eng.processor.scheduler.active_requests
    assert drive(eng)["staying"][-1:] and "going" not in eng.requests


def test_the_pick_sees_each_sequence_that_gets_a_token_in_batch_order(model) -> None:
    seen: list[str] = []

    def pick(rid: str, logits: torch.Tensor) -> int:
        seen.append(rid)
        assert logits.dim() == 1 and logits.dtype == torch.float32
        return {"a": 11, "b": 22}[rid]

    eng = engine(model, pick=pick)
    eng.add("a", prompt(1, 10), 3, eos=[])
    eng.add("b", prompt(2, 10), 3, eos=[])
    got = drive(eng)
    assert got == {"a": [11, 11, 11], "b": [22, 22, 22]}
    assert seen == ["a", "b"] * 3


def test_decoding_sequences_of_like_lengths_attend_in_one_call_and_a_long_one_alone() -> None:
    # a 40-token chunk of a prompt after 60 cached tokens, then decoding sequences of
    # 30, 33, 31 and 900 keys: the three short ones in one group, the 900 alone
    lengths_q = [40, 1, 1, 1, 1]
    lengths_k = [100, 30, 33, 900, 31]
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()])
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()])
    plan = paged_engine.StepPlan.make(tuple(cu_q.tolist()), tuple(cu_k.tolist()), CPU)
    assert plan.alone == [(0, 40, 0, 100), (42, 43, 163, 1063)]
    [group] = plan.groups
    assert group.rows.tolist() == [40, 43, 41] and group.width == 33  # shortest first
    assert group.mask is not None and group.mask.sum().item() == 30 + 31 + 33
    # and what they attend to is what each would attend to alone: 9 query heads, 3 KV heads
    torch.manual_seed(0)
    query = torch.randn(1, 9, sum(lengths_q), 64)
    key, value = torch.randn(2, 1, 3, sum(lengths_k), 64)
    got, _ = paged_engine.varlen_sdpa(torch.nn.Identity(), query, key, value, None,
                                      cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for i in range(len(lengths_q)):
        q0, q1, k0, k1 = cu_q[i].item(), cu_q[i + 1].item(), cu_k[i].item(), cu_k[i + 1].item()
        mask = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).tril(k1 - k0 - (q1 - q0))
        alone = sdpa(query[:, :, q0:q1], key[:, :, k0:k1], value[:, :, k0:k1], attn_mask=mask,
                     enable_gqa=True)
        torch.testing.assert_close(got[0, q0:q1], alone[0].transpose(0, 1))


def test_read_in_place_every_decoding_sequence_is_grouped_and_attends_to_its_own_slots() -> None:
    # the cache a row a slot; each sequence's keys in scattered slots, as blocks are handed
    # out: a 40-token chunk after 60 cached tokens, then decoding sequences of 30, 890, 33,
    # 900 and 31 keys. Read in place, the long ones group as the short ones do
    lengths_q = [40, 1, 1, 1, 1, 1]
    lengths_k = [100, 30, 890, 33, 900, 31]
    cu_q = torch.tensor([0, *torch.tensor(lengths_q).cumsum(0).tolist()])
    cu_k = torch.tensor([0, *torch.tensor(lengths_k).cumsum(0).tolist()])
    plan = paged_engine.StepPlan.make(tuple(cu_q.tolist()), tuple(cu_k.tolist()), CPU,
                                      grouped_keys=None)
    assert plan.alone == [(0, 40, 0, 100)]
    assert [group.rows.tolist() for group in plan.groups] == [[40, 44, 42], [41, 43]]
    torch.manual_seed(0)
    slots = 4096
    cache_k, cache_v = torch.randn(2, slots, 3, 64)
    read = torch.randperm(slots)[:sum(lengths_k)]
    query = torch.randn(1, 9, sum(lengths_q), 64)
    got, _ = paged_engine.varlen_sdpa(
        torch.nn.Identity(), query, cache_k.transpose(0, 1).unsqueeze(0),
        cache_v.transpose(0, 1).unsqueeze(0), None, cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k,
        **{paged_engine.READ_INDEX: read})
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for i in range(len(lengths_q)):
        q0, q1, k0, k1 = cu_q[i].item(), cu_q[i + 1].item(), cu_k[i].item(), cu_k[i + 1].item()
        own_k, own_v = (cache[read[k0:k1]].transpose(0, 1).unsqueeze(0)
                        for cache in (cache_k, cache_v))
        mask = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).tril(k1 - k0 - (q1 - q0))
        alone = sdpa(query[:, :, q0:q1], own_k, own_v, attn_mask=mask, enable_gqa=True)
        torch.testing.assert_close(got[0, q0:q1], alone[0].transpose(0, 1))


def test_the_engine_reads_keys_where_they_lie_in_its_cache(model) -> None:
    eng = engine(model)
    seen: list[tuple[int, int]] = []
    update = eng.cache.update

    def spy(key_states, value_states, layer_idx, kwargs):
        got = update(key_states, value_states, layer_idx, kwargs)
        if layer_idx == 0:
            read = kwargs.get(paged_engine.READ_INDEX)
            seen.append((got[0].shape[2], -1 if read is None else read.numel()))
        return got
    eng.cache.update = spy
    eng.add("a", prompt(1, 40), 2, eos=[])
    assert len(drive(eng)["a"]) == 2
    slots = seen[-1][0]
    # the prompt's one step has nothing cached to read: its own keys; then the whole cache,
    # 41 of its slots read
    assert seen == [(40, -1), (slots, 41)] and slots >= 64 * 32
