"""Sweep presets: which (batch, groups, prefix, suffix, order, page size) points a run measures."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kernels_bench.workload import WorkloadSpec


@dataclass(frozen=True)
class Sweep:
    batch_sizes: tuple[int, ...]
    group_counts: tuple[int, ...] | None
    """Distinct prefix groups to try; None means 1, 2, 4, ... up to the batch size, and the batch size."""
    prefix_lens: tuple[int, ...]
    suffix_lens: tuple[int, ...]
    orders: tuple[str, ...]
    page_sizes: tuple[int, ...]

    def group_counts_for(self, batch_size: int) -> list[int]:
        if self.group_counts is None:
            counts = {1 << i for i in range(batch_size.bit_length()) if 1 << i <= batch_size}
        else:
            counts = {g for g in self.group_counts if g <= batch_size}
        return sorted(counts | {batch_size})

    def specs(self, seed: int = 0) -> Iterator[WorkloadSpec]:
        """Every point; order is varied only where it can matter (1 < groups < batch)."""
        for page_size in self.page_sizes:
            for prefix_len in self.prefix_lens:
                for suffix_len in self.suffix_lens:
                    for batch_size in self.batch_sizes:
                        for num_groups in self.group_counts_for(batch_size):
                            mixed = 1 < num_groups < batch_size
                            for order in self.orders if mixed else self.orders[:1]:
                                yield WorkloadSpec(
                                    batch_size=batch_size,
                                    num_groups=num_groups,
                                    prefix_len=prefix_len,
                                    suffix_len=suffix_len,
                                    page_size=page_size,
                                    order=order,
                                    seed=seed,
                                )


PRESETS: dict[str, Sweep] = {
    "full": Sweep(
        batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        group_counts=None,
        prefix_lens=(1000, 4000, 10000),
        suffix_lens=(20, 64, 128),
        orders=("contiguous", "interleaved", "random"),
        page_sizes=(16,),
    ),
    "reduced": Sweep(
        batch_sizes=(1, 8, 32, 128, 256, 512),
        group_counts=(1, 2, 8, 32, 64),
        prefix_lens=(1000, 4000, 10000),
        suffix_lens=(20,),
        orders=("contiguous", "interleaved"),
        page_sizes=(16,),
    ),
    "tiny": Sweep(
        batch_sizes=(1, 4, 8),
        group_counts=(1, 2),
        prefix_lens=(64,),
        suffix_lens=(20,),
        orders=("contiguous", "interleaved"),
        page_sizes=(16,),
    ),
}
"""`reduced` fits in about 6 minutes on an H200; `tiny` is the CPU smoke run."""
