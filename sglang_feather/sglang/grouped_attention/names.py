"""The grouped backend's name and its startup error."""

GROUPED = "feather_grouped"
"""The `--attention-backend` value the plugin adds."""


class GroupedAttentionError(ValueError):
    """`--attention-backend feather_grouped` was chosen for a model or mode it cannot serve."""
