"""Trace-driven simulator of SGLang continuous batching with a physics cost model of one GPU."""
