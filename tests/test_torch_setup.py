"""torch_setup.optimizers_without_dynamo: the same weights as stock torch, and no torch._dynamo."""

import subprocess
import sys

import pytest

SCRIPT = r"""
import sys, hashlib, torch
if sys.argv[1] == "patched":
    from reflectrl.torch_setup import optimizers_without_dynamo
    assert optimizers_without_dynamo()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
flat = torch.nn.utils.parameters_to_vector(net.parameters()).detach().requires_grad_(True)
fused = torch.optim.Adam([flat], lr=3e-4, eps=1e-5, fused=True)
plain = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)
for i in range(30):
    x = torch.randn(32, 8)
    loss = (flat[:100].sum() * x.sum()) ** 2
    fused.zero_grad(); loss.backward(); fused.step()
    loss2 = net(x).pow(2).mean(); plain.zero_grad(); loss2.backward(); plain.step()
    if i == 10:
        fused.load_state_dict(fused.state_dict()); plain.load_state_dict(plain.state_dict())
digest = hashlib.sha256(flat.detach().numpy().tobytes()
                        + torch.nn.utils.parameters_to_vector(net.parameters()).detach().numpy().tobytes())
print(digest.hexdigest(), "torch._dynamo" in sys.modules)
"""


def _run(mode):
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    digest, dynamo = out.stdout.split()
    return digest, dynamo == "True"


@pytest.mark.slow
def test_optimizers_give_the_same_weights_without_importing_dynamo():
    stock, patched = _run("stock"), _run("patched")
    assert stock[0] == patched[0]  # bit-identical Adam (fused) and AdamW steps, state_dict round trips
    assert stock[1] is True and patched[1] is False
