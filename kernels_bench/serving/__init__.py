"""End-to-end serving benchmark: SGLang with fcfs / lpm / dfs-weight / feather on the paper's shared-prefix workloads."""
