"""The paper's serving workloads: 8 prefix groups x 100 requests at each prefix length, plus no sharing."""

from collections.abc import Sequence
from dataclasses import dataclass

from sglang_feather.serving import Workload
from sglang_feather.workload import SharedPrefixSpec


@dataclass(frozen=True)
class WorkloadPlan:
    prefix_lens: tuple[int, ...] = (1024, 4096, 10240)
    num_groups: int = 8
    prompts_per_group: int = 100
    question_len: int = 64
    output_len: int = 128
    no_sharing_len: int | None = 4096


DRY_SMALL = WorkloadPlan(
    prefix_lens=(128,), num_groups=2, prompts_per_group=4, question_len=8, output_len=8, no_sharing_len=128
)


def build_workloads(plan: WorkloadPlan) -> Sequence[Workload]:
    """`shared-<P>` per prefix length P; `no-sharing` has as many requests, each with its own prompt."""
    workloads = [
        Workload(
            f"shared-{prefix_len}",
            SharedPrefixSpec.per_group(
                plan.num_groups,
                plan.prompts_per_group,
                prefix_len=prefix_len,
                question_len=plan.question_len,
                output_len=plan.output_len,
            ),
        )
        for prefix_len in plan.prefix_lens
    ]
    if plan.no_sharing_len is not None:
        num_requests = plan.num_groups * plan.prompts_per_group
        workloads.append(
            Workload.no_sharing("no-sharing", num_requests, plan.no_sharing_len, plan.output_len)
        )
    return workloads
