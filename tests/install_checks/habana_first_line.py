# Run in the fresh venv: Gaudi code whose first line imports habana_frameworks (before torch, as Habana's examples
# start); forward and backward on `hpu` match the CPU. Prints where habana_frameworks and hpu_nb came from (JSON).
import json

import habana_frameworks
import habana_frameworks.torch.core as htcore
import torch

import hpu_nb

torch.manual_seed(0)
w = torch.randn(4, 3, requires_grad=True)
x = torch.randn(5, 4)
reference = torch.nn.functional.gelu(x @ w).square().sum()
reference.backward()

w_hpu = w.detach().to("hpu").requires_grad_()
out = torch.nn.functional.gelu(x.to("hpu") @ w_hpu).square().sum()
out.backward()
htcore.mark_step()
assert w_hpu.grad.device.type == "hpu", w_hpu.grad.device
torch.testing.assert_close(out.cpu(), reference.detach())
torch.testing.assert_close(w_hpu.grad.cpu(), w.grad)
print(json.dumps({"habana_frameworks": habana_frameworks.__file__, "hpu_nb": hpu_nb.__file__,
                  "device": str(w_hpu.grad.device)}))
