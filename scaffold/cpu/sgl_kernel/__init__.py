"""CPU test scaffolding: a stub for the CUDA-only sgl_kernel wheel; every op raises when called."""

__version__ = "0.0.0+feather-cpu-stub"


class StubKernelCalled(NotImplementedError):
    """A real sgl_kernel op was called on the CPU test scaffolding."""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing_kernel(*args, **kwargs):
        raise StubKernelCalled(
            f"sgl_kernel.{name} was called, but this venv has only the CPU test stub "
            "(scaffold/cpu/sgl_kernel); use --attention-backend torch_native on CPU or a real sgl-kernel on GPU"
        )

    missing_kernel.__name__ = name
    return missing_kernel
