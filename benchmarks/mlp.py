"""The MLP the benchmarks train, built in one place for pycyxwiz and for torch.

Linear layers with a ReLU between each two, cross-entropy, Adam lr 1e-3: "small" = 784-256-10 and
"large" = 784-4096-4096-10. The framework module is an argument, so importing this file loads neither
pycyxwiz nor torch: train_throughput's torch ranks never load pycyxwiz, and gpu_step reports a failed
import of either itself. The benchmarks put their own folder on sys.path (a script's folder is there
already when it is run as `python benchmarks/x.py`).
"""

MODELS = {"small": [784, 256, 10], "large": [784, 4096, 4096, 10]}
LR = 1e-3


def build_cx(cx, sizes, seed=None):
    """(model, cx.CrossEntropyLoss(), cx.AdamOptimizer(LR)) for layer sizes [in, hidden..., out].

    With `seed`, cx.manual_seed(seed) first. The parameters are drawn layer by layer (W0, b0, W1, b1,
    ...), the order torch's nn.Sequential of torch_mlp lists them in, so the same seed gives the same
    initial weights, and torch models can take them over parameter by parameter."""
    if seed is not None:
        cx.manual_seed(seed)
    model = cx.SequentialModel()
    for i in range(len(sizes) - 1):
        model.add(cx.LinearModule(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            model.add(cx.ReLUModule())
    return model, cx.CrossEntropyLoss(), cx.AdamOptimizer(LR)


def torch_mlp(torch, sizes):
    """The same layers as a torch.nn.Sequential, initialised by torch's own generator (torch.manual_seed)."""
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def build_torch(torch, sizes, weights, device, fused):
    """torch_mlp with the given (pycyxwiz's) initial weights on `device`, and its Adam (fused or not)."""
    model = torch_mlp(torch, sizes)
    with torch.no_grad():  # pycyxwiz's initial weights; the parameter order matches (W0, b0, W1, b1, ...)
        for p, w in zip(model.parameters(), weights):
            p.copy_(torch.from_numpy(w))
    model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=LR, fused=True) if fused else torch.optim.Adam(model.parameters(), lr=LR)
    return model, opt
