"""CUDA generation: the causal LM handler serves SmolLM2 on ``cuda:0`` in bf16 (model-config.yaml
``handler: {dtype: bfloat16}``, as LLM users serve on GPUs), its paged KV cache on the GPU and
sized as a fraction of its free memory (``kvCacheMemory: 0.1``), its greedy answer the tokens
``generate()`` gives on the same device and dtype. Skipped without an NVIDIA GPU."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = REPO / "model_store" / "smollm2.mar"
HAS_GPU = bool(os.path.isdir("/proc/driver/nvidia/gpus") and os.listdir("/proc/driver/nvidia/gpus"))
pytestmark = pytest.mark.skipif(not HAS_GPU, reason="needs an NVIDIA GPU (make test-gpu)")


def test_bf16_generation_on_the_gpu_gives_what_generate_gives(tmp_path) -> None:
    from handlers.causal_lm import CausalLM
    from handlers.mock_context import MockContext
    from handlers.ts_compat import install_ts_aliases

    install_ts_aliases()  # the handler reports its metrics through ts.metrics, as in a worker
    with zipfile.ZipFile(ARCHIVE) as archive:
        archive.extractall(tmp_path)
    context = MockContext(model_dir=str(tmp_path), gpu_id=0)
    context.model_yaml_config = {"continuousBatching": "true", "kvCacheMemory": 0.1,
                                 "handler": {"dtype": "bfloat16"}}
    free, _ = torch.cuda.mem_get_info(0)
    lm = CausalLM()
    lm.initialize(context)
    weights = next(lm.model.parameters())
    assert weights.dtype == torch.bfloat16 and weights.device.type == "cuda"
    engine = lm.engine
    assert engine.cache.cache_tensor.device.type == "cuda" and engine.budget.page_size == 64
    assert engine.budget.bytes_per_token == 2 * 30 * 3 * 64 * 2  # bf16: 2 bytes an element
    assert 0 < engine.budget.budget <= 0.1 * free  # the weights were loaded before it was sized
    assert lm.model.config._attn_implementation == "sdpa"  # not switched to flash
    prompt = "The capital of France is"
    text, rid = "", "bf16-0"
    for _ in range(100):
        context.request_ids = {0: rid}
        [out] = lm.handle([{"body": {"prompt": prompt, "max_tokens": 12}}], context)
        text += str(out)
        if context.stopping_criteria[0](out):
            break
    ids = lm.tokenizer(prompt, return_tensors="pt")["input_ids"].to(lm.device)
    alone = lm.model.generate(ids, max_new_tokens=12, do_sample=False)
    assert text == lm.tokenizer.decode(alone[0, ids.shape[1]:], skip_special_tokens=True)
