"""Loaded by every Python process of a torch_suite run (run.py puts this folder first on PYTHONPATH),
including the rank processes PyTorch's harness spawns, which never see a conftest.

With TORCH_SUITE_BACKEND=cyxwiz it registers the backend and, as PyTorch's test helpers are imported,
points their CPU backend at it: the helpers hard-code "gloo" for CPU tensors, and the skip tables of
distributed_test.py (DistTestCases) list the backends that may run DDP and sub-group tests. Nothing
else of PyTorch's tests is changed. With any other value, or none, this file does nothing.
"""

import importlib.machinery
import os
import sys

_BACKEND = os.environ.get("TORCH_SUITE_BACKEND", "")


def _patch_common_distributed(module) -> None:
    # What the backend implements, as distributed_test.py's decorators ask (not "gpu"/"cuda": CPU only).
    for feature in ("ddp", "subgroup", "plugin"):
        module.DistTestCases.backend_feature[feature].add(_BACKEND)
    base = module.DistributedTestBase
    gloo_for = base.backend

    def backend(self, device):
        name = gloo_for(self, device)
        return _BACKEND if name == "gloo" else name

    base.backend = backend


def _patch_common_fsdp(module) -> None:
    if module.DISTRIBUTED_BACKEND == "gloo":
        module.DISTRIBUTED_BACKEND = _BACKEND


_PATCHES = {
    "torch.testing._internal.common_distributed": _patch_common_distributed,
    "torch.testing._internal.common_fsdp": _patch_common_fsdp,
}


class _PatchAfterImport:
    """A meta-path finder that lets the normal finder load a module, then applies its patch."""

    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


if _BACKEND and _BACKEND != "gloo":
    sys.meta_path.insert(0, _PatchAfterImport())
    if _BACKEND == "cyxwiz":
        import pycyxwiz.torch  # registers "cyxwiz" in this process

        _trace = os.environ.get("TORCH_SUITE_TRACE")
        if _trace:
            # One line per group the backend makes: proof that a file's tests ran on it, not on gloo.
            import torch.distributed as _dist

            _plugin = _dist.Backend._plugins["CYXWIZ"]

            def _traced(store, rank, size, timeout):
                with open(_trace, "a") as f:
                    f.write(f"{os.getpid()} rank {rank} of {size}\n")
                return _plugin.creator_fn(store, rank, size, timeout)

            _dist.Backend._plugins["CYXWIZ"] = _plugin._replace(creator_fn=_traced)
