"""A course's usual training script runs unchanged with ``import pyflow as torch`` (issue 33's bar).

``SCRIPT`` is written for PyTorch: dataset -> split -> loader -> model -> loss -> optimizer ->
scheduler -> checkpoint -> reload -> evaluate.  Only its import lines differ between the two
libraries (``IMPORTS``).  It runs on pyflow on cpu and on cuda (the simulator here), with a
shuffled loader and ``random_split`` as a course writes it; and, where PyTorch is installed (the
``torch`` extra), once more on both libraries without randomness in the data order (a fixed
split, no shuffle, the same initial weights), where the losses of every step and the test accuracy
must agree.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

IMPORTS = {
    "torch": "import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, Subset, TensorDataset, random_split\n",
    "pyflow": ("import pyflow as torch\nfrom pyflow import nn\n"
               "from pyflow.utils.data import DataLoader, Subset, TensorDataset, random_split\n"),
}

SCRIPT = '''
torch.manual_seed(0)
rng = np.random.default_rng(0)
features = rng.standard_normal((96, 6)).astype(np.float32)
labels = (features @ rng.standard_normal((6, 3))).argmax(1)
dataset = TensorDataset(torch.tensor(features), torch.tensor(labels))
if FIXED_ORDER:
    train_set, test_set = Subset(dataset, list(range(64))), Subset(dataset, list(range(64, 96)))
else:
    train_set, test_set = random_split(dataset, [64, 32], generator=torch.Generator().manual_seed(1))
loader = DataLoader(train_set, batch_size=16, shuffle=not FIXED_ORDER, drop_last=False)


def make_model():
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).to(DEVICE)


model = make_model()
if INITIAL is not None:
    model.load_state_dict({name: torch.tensor(value) for name, value in INITIAL.items()})
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
loss_fn = nn.CrossEntropyLoss()
losses = []
for epoch in range(3):
    model.train()
    for xb, yb in loader:
        xb, yb = xb.to(DEVICE), yb.to(DEVICE)
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    scheduler.step()

torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3}, CHECKPOINT)
checkpoint = torch.load(CHECKPOINT)
restored = make_model()
restored.load_state_dict(checkpoint["model"])
restored.eval()
correct = 0
with torch.no_grad():
    for xb, yb in DataLoader(test_set, batch_size=32):
        correct += (restored(xb.to(DEVICE)).argmax(dim=1) == yb.to(DEVICE)).sum().item()
accuracy = correct / len(test_set)
same = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(model.state_dict().values(), restored.state_dict().values()))
'''


def run(library: str, device: str, checkpoint, fixed_order: bool, initial=None) -> dict:
    namespace = {"np": np, "DEVICE": device, "CHECKPOINT": str(checkpoint), "FIXED_ORDER": fixed_order,
                 "INITIAL": initial}
    exec(compile(IMPORTS[library] + SCRIPT, f"<course script on {library}>", "exec"), namespace)  # noqa: S102
    return namespace


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_usual_script_trains_saves_reloads_and_evaluates_on_pyflow(tmp_path, device):
    done = run("pyflow", device, tmp_path / "model.pt", fixed_order=False)
    losses = done["losses"]
    assert len(losses) == 3 * 4 and all(np.isfinite(losses))
    assert np.mean(losses[-4:]) < np.mean(losses[:4]), losses   # it learns
    assert done["same"], "the reloaded model's state differs from the saved one"
    assert done["checkpoint"]["epoch"] == 3 and set(done["checkpoint"]["optimizer"]) == {"state", "param_groups"}
    assert 0.0 <= done["accuracy"] <= 1.0


def test_cpu_and_cuda_train_alike(tmp_path):
    cpu = run("pyflow", "cpu", tmp_path / "cpu.pt", fixed_order=False)
    cuda = run("pyflow", "cuda", tmp_path / "cuda.pt", fixed_order=False)
    np.testing.assert_allclose(cuda["losses"], cpu["losses"], rtol=1e-5, atol=1e-6)
    assert cuda["accuracy"] == cpu["accuracy"]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch: pip install -e '.[torch]'")
def test_the_same_script_gives_pytorchs_losses(tmp_path):
    rng = np.random.default_rng(7)
    initial = {"0.weight": rng.uniform(-0.4, 0.4, (16, 6)), "0.bias": rng.uniform(-0.4, 0.4, 16),
               "2.weight": rng.uniform(-0.25, 0.25, (3, 16)), "2.bias": rng.uniform(-0.25, 0.25, 3)}
    initial = {name: value.astype(np.float32) for name, value in initial.items()}
    reference = run("torch", "cpu", tmp_path / "torch.pt", fixed_order=True, initial=initial)
    for device in ("cpu", "cuda"):
        mine = run("pyflow", device, tmp_path / f"pyflow_{device}.pt", fixed_order=True, initial=initial)
        np.testing.assert_allclose(mine["losses"], reference["losses"], rtol=2e-5, atol=1e-6, err_msg=device)
        assert mine["accuracy"] == reference["accuracy"], device
