"""Decode-attention benchmarks that measure how prefix homogeneity of a batch changes DRAM traffic."""
