"""Prefix-grouped decode attention for SGLang: each shared prefix read once per step (`feather_grouped`)."""

from sglang_feather.sglang.grouped_attention.names import GROUPED, GroupedAttentionError

__all__ = ["GROUPED", "GroupedAttentionError"]
