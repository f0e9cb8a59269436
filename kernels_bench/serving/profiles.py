"""Per-machine server settings (memory fraction, batch limits) for the serving benchmark, by name."""

from dataclasses import dataclass


@dataclass(frozen=True)
class MachineProfile:
    description: str
    device: str
    server_args: tuple[str, ...]


def _gpu(mem_fraction: float, max_running: int, chunked_prefill: int, description: str) -> MachineProfile:
    return MachineProfile(
        description=description,
        device="cuda",
        server_args=(
            "--mem-fraction-static",
            str(mem_fraction),
            "--max-running-requests",
            str(max_running),
            "--chunked-prefill-size",
            str(chunked_prefill),
            "--cuda-graph-max-bs-decode",
            str(min(max_running, 512)),
        ),
    )


# KV budget for a Llama-3-8B-class model (bf16, 32 layers, 8 KV heads x 128): 128 KiB per token; weights 16 GB.
PROFILES: dict[str, MachineProfile] = {
    "a100-80gb": _gpu(0.85, 256, 8192, "A100 80GB: ~52 GB KV, ~400K tokens; 256 running requests"),
    "rtx6000-ada": _gpu(0.85, 128, 4096, "RTX 6000 Ada 48GB: ~25 GB KV, ~190K tokens; 128 running requests"),
    "h200": _gpu(0.88, 512, 16384, "H200 141GB: ~108 GB KV, ~840K tokens; 512 running requests"),
    "cpu-tiny": MachineProfile(
        description="CPU smoke test with the tiny random Llama (models/tiny-llama)",
        device="cpu",
        server_args=("--max-running-requests", "16"),
    ),
}
