"""Train the digits CNN on scikit-learn's bundled 8x8 handwritten digits (no download).

Writes, next to this file: ``digits_cnn.pt`` (the state dict), ``index_to_name.json`` and
``images/<digit>_<n>.png``, one held-out test digit per class rendered as an 8x8 grayscale PNG
(``n`` is its index in ``load_digits()``). Seeded and deterministic; well under a minute on CPU.

    .venv/bin/python samples/digits/train.py
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

HERE = Path(__file__).resolve().parent
SEED = 0
EPOCHS = 40
BATCH = 64
# load_digits() pixels are ink levels 0..16; the model sees level / 16, a PNG stores level * 255 / 16.
MAX_LEVEL = 16.0


def _model_class() -> type[nn.Module]:
    spec = importlib.util.spec_from_file_location("digits_model", HERE / "digits_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DigitsCNN


def _to_png(levels: np.ndarray, path: Path) -> None:
    pixels = np.rint(levels.reshape(8, 8) * (255.0 / MAX_LEVEL)).astype(np.uint8)
    Image.fromarray(pixels, mode="L").save(path)


def _from_png(path: Path) -> torch.Tensor:
    """What the handler does to an image: grayscale, 8x8, scaled to [0, 1]."""
    pixels = np.asarray(Image.open(path).convert("L").resize((8, 8)), dtype=np.float32) / 255.0
    return torch.from_numpy(pixels).reshape(1, 1, 8, 8)


def train() -> float:
    """Train, write the artefacts and return the held-out accuracy."""
    torch.manual_seed(SEED)
    digits = load_digits()
    x = digits.data.astype(np.float32) / MAX_LEVEL
    y = digits.target.astype(np.int64)
    idx_train, idx_test = train_test_split(
        np.arange(len(y)), test_size=0.25, random_state=SEED, stratify=y
    )
    x_train = torch.from_numpy(x[idx_train]).reshape(-1, 1, 8, 8)
    y_train = torch.from_numpy(y[idx_train])
    x_test = torch.from_numpy(x[idx_test]).reshape(-1, 1, 8, 8)
    y_test = torch.from_numpy(y[idx_test])

    model = _model_class()()
    optimiser = torch.optim.Adam(model.parameters(), lr=2e-3)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(SEED)
    for _ in range(EPOCHS):
        model.train()
        order = torch.randperm(len(y_train), generator=generator)
        for start in range(0, len(order), BATCH):
            batch = order[start : start + BATCH]
            optimiser.zero_grad()
            loss_fn(model(x_train[batch]), y_train[batch]).backward()
            optimiser.step()

    model.eval()
    with torch.no_grad():
        predicted = model(x_test).argmax(dim=1)
    accuracy = (predicted == y_test).float().mean().item()

    torch.save(model.state_dict(), HERE / "digits_cnn.pt")
    (HERE / "index_to_name.json").write_text(
        json.dumps({str(i): str(i) for i in range(10)}, indent=1) + "\n"
    )
    images = HERE / "images"
    images.mkdir(exist_ok=True)
    for old in images.glob("*.png"):
        old.unlink()
    # The first held-out example of each digit that the model gets right *after* the PNG round
    # trip, so the committed images double as a smoke test of the served model.
    for digit in range(10):
        for position in np.flatnonzero(y_test.numpy() == digit):
            n = int(idx_test[position])
            path = images / f"{digit}_{n}.png"
            _to_png(digits.data[n], path)
            with torch.no_grad():
                if model(_from_png(path)).argmax(dim=1).item() == digit:
                    break
            path.unlink()
    return accuracy


if __name__ == "__main__":
    acc = train()
    print(f"held-out accuracy: {acc:.4f} ({HERE / 'digits_cnn.pt'})")
