"""Benchmarks of Feather's scheduling overhead against the engines' own policies (`python -m sglang_feather.bench`)."""
