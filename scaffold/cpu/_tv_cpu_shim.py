"""CPU test scaffolding: define torchvision::nms/qnms schemas before a CUDA-built torchvision imports."""

import importlib.abc
import sys


class _TorchvisionCpuShim(importlib.abc.MetaPathFinder):
    """Runs once, on the first `import torchvision`, then steps aside.

    torchvision/_meta_registrations.py registers fake kernels for these two ops unconditionally;
    with its CUDA `_C.so` unloadable the ops do not exist and the import raises. Defining the
    schemas (no kernel) lets the import finish; a call to the op still raises.
    """

    done = False

    def find_spec(self, name, path=None, target=None):
        if name == "torchvision" and not _TorchvisionCpuShim.done:
            _TorchvisionCpuShim.done = True
            import torch

            for op in ("nms", "qnms"):
                try:
                    torch.library.define(
                        f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
                    )
                except RuntimeError:
                    pass  # already defined: a working torchvision build is installed
        return None


sys.meta_path.insert(0, _TorchvisionCpuShim())
