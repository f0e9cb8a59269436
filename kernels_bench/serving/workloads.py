"""The paper's serving workloads: 8 prefix groups x 100 requests at each prefix length, plus no sharing."""

from collections.abc import Sequence
from dataclasses import dataclass, replace

from sglang_feather.serving import Workload
from sglang_feather.workload import SharedPrefixSpec


@dataclass(frozen=True)
class WorkloadPlan:
    """`spec` served at each of `prefix_lens` (its own prefix_len is replaced), then, unless `no_sharing_len`
    is None, as many requests with prompts of that length sharing nothing."""

    spec: SharedPrefixSpec = SharedPrefixSpec.per_group(8, 100, question_len=64, output_len=128)
    prefix_lens: tuple[int, ...] = (1024, 4096, 10240)
    no_sharing_len: int | None = 4096


DRY_SMALL = WorkloadPlan(
    SharedPrefixSpec.per_group(2, 4, prefix_len=128, question_len=8, output_len=8),
    prefix_lens=(128,),
    no_sharing_len=128,
)


def build_workloads(plan: WorkloadPlan) -> Sequence[Workload]:
    """`shared-<P>` per prefix length P; `no-sharing` has as many requests, each with its own prompt."""
    workloads = [Workload(f"shared-{p}", replace(plan.spec, prefix_len=p)) for p in plan.prefix_lens]
    if plan.no_sharing_len is not None:
        spec = plan.spec
        workloads.append(
            Workload.no_sharing("no-sharing", spec.num_requests, plan.no_sharing_len, spec.output_len)
        )
    return workloads
